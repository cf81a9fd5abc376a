#include "rails/nixl/library.h"

#include <dlfcn.h>

#include <mutex>

#include <c10/util/Exception.h>

namespace fairring::rails::nixl {

namespace {

// Loaded libraries stay for the process's life: NIXL's plugins and UCX keep
// threads and handlers that must not outlive their code.
struct Loaded {
  std::string path;
  void* library = nullptr;
  Api api{};
};

template <typename Function>
void resolve(
    void* library,
    const std::string& path,
    const char* symbol,
    Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  TORCH_CHECK(
      function != nullptr,
      "fairring: ",
      path,
      " has no ",
      symbol,
      "; the NIXL rails need NIXL 1.4 or later (pip install 'nixl-cu13>=1.4')");
}

Api resolveAll(void* library, const std::string& path) {
  Api api{};
  const auto get = [&](const char* symbol, auto& function) {
    resolve(library, path, symbol, function);
  };
  get("nixl_capi_create_configured_agent", api.createAgent);
  get("nixl_capi_destroy_agent", api.destroyAgent);
  get("nixl_capi_get_available_plugins", api.availablePlugins);
  get("nixl_capi_string_list_size", api.stringListSize);
  get("nixl_capi_string_list_get", api.stringListGet);
  get("nixl_capi_destroy_string_list", api.destroyStringList);
  get("nixl_capi_create_params", api.createParams);
  get("nixl_capi_params_add", api.paramsAdd);
  get("nixl_capi_destroy_params", api.destroyParams);
  get("nixl_capi_create_backend", api.createBackend);
  get("nixl_capi_destroy_backend", api.destroyBackend);
  get("nixl_capi_create_opt_args", api.createOptArgs);
  get("nixl_capi_opt_args_add_backend", api.optArgsAddBackend);
  get("nixl_capi_opt_args_set_notif_msg", api.optArgsSetNotifMessage);
  get("nixl_capi_opt_args_set_has_notif", api.optArgsSetHasNotif);
  get("nixl_capi_destroy_opt_args", api.destroyOptArgs);
  get("nixl_capi_create_reg_dlist", api.createRegList);
  get("nixl_capi_reg_dlist_add_desc", api.regListAdd);
  get("nixl_capi_destroy_reg_dlist", api.destroyRegList);
  get("nixl_capi_register_mem", api.registerMemory);
  get("nixl_capi_deregister_mem", api.deregisterMemory);
  get("nixl_capi_get_local_md", api.localMetadata);
  get("nixl_capi_load_remote_md", api.loadRemoteMetadata);
  get("nixl_capi_invalidate_remote_md", api.invalidateRemoteMetadata);
  get("nixl_capi_create_xfer_dlist", api.createXferList);
  get("nixl_capi_xfer_dlist_add_desc", api.xferListAdd);
  get("nixl_capi_destroy_xfer_dlist", api.destroyXferList);
  get("nixl_capi_create_xfer_req", api.createXferRequest);
  get("nixl_capi_post_xfer_req", api.postXferRequest);
  get("nixl_capi_get_xfer_status", api.xferStatus);
  get("nixl_capi_release_xfer_req", api.releaseXferRequest);
  get("nixl_capi_destroy_xfer_req", api.destroyXferRequest);
  get("nixl_capi_create_notif_map", api.createNotifMap);
  get("nixl_capi_destroy_notif_map", api.destroyNotifMap);
  get("nixl_capi_get_notifs", api.notifs);
  get("nixl_capi_notif_map_size", api.notifMapSize);
  get("nixl_capi_notif_map_get_agent_at", api.notifMapAgentAt);
  get("nixl_capi_notif_map_get_notifs_size", api.notifMapCount);
  get("nixl_capi_notif_map_get_notif", api.notifMapGet);
  get("nixl_capi_notif_map_clear", api.notifMapClear);
  get("nixl_capi_gen_notif", api.sendNotif);
  return api;
}

} // namespace

const Api& load(const std::string& path) {
  static std::mutex mutex;
  static Loaded loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded.library != nullptr) {
    TORCH_CHECK(
        path == loaded.path,
        "fairring: NIXL was loaded from ",
        loaded.path,
        " and cannot be loaded again from ",
        path);
    return loaded.api;
  }
  TORCH_CHECK(
      !path.empty(),
      "fairring: FAIRRING_RAILS_TRANSPORT=nixl, but no NIXL library was found; "
      "install it with pip install 'nixl-cu13>=1.4'");
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(
      library != nullptr,
      "fairring: cannot load NIXL's C API from ",
      path,
      ": ",
      dlerror(),
      "; reinstall it with pip install 'nixl-cu13>=1.4'");
  Api api = resolveAll(library, path);
  loaded.path = path;
  loaded.library = library;
  loaded.api = api;
  return loaded.api;
}

std::string statusText(int status) {
  const char* name = "an unknown status";
  switch (status) {
    case 0:
      name = "NIXL_CAPI_SUCCESS";
      break;
    case 1:
      name = "NIXL_CAPI_IN_PROG";
      break;
    case -1:
      name = "NIXL_CAPI_ERROR_INVALID_PARAM";
      break;
    case -2:
      name = "NIXL_CAPI_ERROR_BACKEND";
      break;
    case -3:
      name = "NIXL_CAPI_ERROR_INVALID_STATE";
      break;
    case -4:
      name = "NIXL_CAPI_ERROR_EXCEPTION";
      break;
    case -6:
      name = "NIXL_CAPI_ERROR_NOT_FOUND";
      break;
    default:
      break;
  }
  return std::string(name) + " (" + std::to_string(status) + ")";
}

} // namespace fairring::rails::nixl
