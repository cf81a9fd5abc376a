#pragma once

// NIXL's C API (libnixl_capi.so, in the nixl-cu12 and nixl-cu13 wheels),
// loaded at run time with dlopen, so that fairring builds and imports without
// NIXL and only a rank that asks for the NIXL rails needs it. Declared here
// are the calls the rails make, as the API documents them (stable since NIXL
// 1.4); handles are opaque pointers.

#include <cstddef>
#include <cstdint>
#include <string>

namespace fairring::rails::nixl {

enum Status : int {
  kSuccess = 0,
  kInProgress = 1,
};
enum MemoryType : int { kDram = 0, kVram = 1 };
enum Operation : int { kRead = 0, kWrite = 1 };

using Handle = void*;

// How an agent runs (the C API's agent configuration, field for field).
struct AgentConfig {
  bool progressThread;
  bool listenThread;
  int listenPort;
  int threadSync; // 0: none, 1: strict, 2: read-write
  unsigned int workers; // 0: the backend's default
  uint64_t progressDelayUs;
  uint64_t listenDelayUs;
  bool telemetry;
};

struct Api {
  using Create = int (*)(Handle*);
  using Destroy = int (*)(Handle);

  int (*createAgent)(
      const char* name, const AgentConfig* config, Handle* agent);
  Destroy destroyAgent;
  int (*availablePlugins)(Handle agent, Handle* list);
  int (*stringListSize)(Handle list, size_t* size);
  int (*stringListGet)(Handle list, size_t index, const char** text);
  Destroy destroyStringList;
  Create createParams;
  int (*paramsAdd)(Handle params, const char* key, const char* value);
  Destroy destroyParams;
  int (*createBackend)(
      Handle agent, const char* plugin, Handle params, Handle* backend);
  Destroy destroyBackend;
  Create createOptArgs;
  int (*optArgsAddBackend)(Handle args, Handle backend);
  int (*optArgsSetNotifMessage)(Handle args, const void* data, size_t length);
  int (*optArgsSetHasNotif)(Handle args, bool hasNotif);
  Destroy destroyOptArgs;
  int (*createRegList)(int memoryType, Handle* list);
  int (*regListAdd)(
      Handle list,
      uintptr_t address,
      size_t length,
      uint64_t deviceId,
      const void* metadata,
      size_t metadataLength);
  Destroy destroyRegList;
  int (*registerMemory)(Handle agent, Handle list, Handle args);
  int (*deregisterMemory)(Handle agent, Handle list, Handle args);
  int (*localMetadata)(Handle agent, void** data, size_t* length);
  int (*loadRemoteMetadata)(
      Handle agent, const void* data, size_t length, char** agentName);
  int (*invalidateRemoteMetadata)(Handle agent, const char* remoteAgent);
  int (*createXferList)(int memoryType, Handle* list);
  int (*xferListAdd)(
      Handle list, uintptr_t address, size_t length, uint64_t deviceId);
  Destroy destroyXferList;
  int (*createXferRequest)(
      Handle agent,
      int operation,
      Handle local,
      Handle remote,
      const char* remoteAgent,
      Handle* request,
      Handle args);
  int (*postXferRequest)(Handle agent, Handle request, Handle args);
  int (*xferStatus)(Handle agent, Handle request);
  int (*releaseXferRequest)(Handle agent, Handle request);
  Destroy destroyXferRequest;
  Create createNotifMap;
  Destroy destroyNotifMap;
  int (*notifs)(Handle agent, Handle map, Handle args);
  int (*notifMapSize)(Handle map, size_t* size);
  int (*notifMapAgentAt)(Handle map, size_t index, const char** agent);
  int (*notifMapCount)(Handle map, const char* agent, size_t* count);
  int (*notifMapGet)(
      Handle map,
      const char* agent,
      size_t index,
      const void** data,
      size_t* length);
  int (*notifMapClear)(Handle map);
  int (*sendNotif)(
      Handle agent,
      const char* remoteAgent,
      const void* data,
      size_t length,
      Handle args);
};

// The API in the library at `path`, loaded once per process (later calls
// must name the same path). Throws, saying what to check, if it cannot be
// loaded or lacks a call.
const Api& load(const std::string& path);

// A status as text: "NIXL_CAPI_ERROR_BACKEND (-2)".
std::string statusText(int status);

} // namespace fairring::rails::nixl
