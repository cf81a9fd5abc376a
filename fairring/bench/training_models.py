"""The models of the training study (fairring.bench.training): real ones, and real shapes with emulated compute.

Real compute: a convolutional network and a GPT-shaped transformer, trained on
synthetic data of the right shapes, on this machine's CPUs.

Emulated compute: the parameter shapes of ResNet-50, BERT-base and GPT-2 small,
layer by layer, where each layer's forward and backward take the time a stated
GPU would, at a stated utilisation, for a stated batch, scaled up by as much as
the emulated network is slower than the real one. DDP sees ordinary parameters
and gradients, so its buckets, hooks and overlap are the real ones; only the
arithmetic is replaced by a sleep, which leaves the CPUs to communication.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

# -- real compute ----------------------------------------------------------------------


class ConvNet(torch.nn.Module):
    """A ResNet-18-like network (4 stages of 2 residual blocks), 32x32 RGB images, 100 classes."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, width, 3, padding=1, bias=False), torch.nn.BatchNorm2d(width), torch.nn.ReLU()
        )
        blocks = []
        channels = width
        for stage in range(4):
            out = width * 2**stage
            for block in range(2):
                blocks.append(_Residual(channels, out, stride=2 if block == 0 and stage > 0 else 1))
                channels = out
        self.blocks = torch.nn.Sequential(*blocks)
        self.head = torch.nn.Linear(channels, 100)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(images))
        return self.head(features.mean(dim=(2, 3)))


class _Residual(torch.nn.Module):
    def __init__(self, channels: int, out: int, stride: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(channels, out, 3, stride=stride, padding=1, bias=False),
            torch.nn.BatchNorm2d(out),
            torch.nn.ReLU(),
            torch.nn.Conv2d(out, out, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(out),
        )
        self.skip = (
            torch.nn.Sequential(torch.nn.Conv2d(channels, out, 1, stride=stride, bias=False), torch.nn.BatchNorm2d(out))
            if stride != 1 or channels != out
            else torch.nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class Gpt(torch.nn.Module):
    """A GPT-2-shaped decoder: token and position embeddings, pre-norm blocks, tied output head."""

    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(length, device=tokens.device))
        x = self.norm(self.blocks(x, mask=self.causal[:length, :length], is_causal=True))
        return x @ self.tokens.weight.t()


@dataclass(frozen=True)
class RealModel:
    """A model this machine really trains, and the shape of one rank's batch."""

    name: str
    kind: str  # "cnn" or "gpt"
    batch: int
    size: dict[str, int]

    def build(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return ConvNet(**self.size) if self.kind == "cnn" else Gpt(**self.size)

    def data(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(1_000_003 * step + rank)
        if self.kind == "cnn":
            images = torch.randn(self.batch, 3, 32, 32, generator=generator)
            return images, torch.randint(0, 100, (self.batch,), generator=generator)
        vocab, context = self.size["vocab"], self.size["context"]
        tokens = torch.randint(0, vocab, (self.batch, context + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(inputs)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


REAL_MODELS = {
    "cnn": RealModel("cnn", "cnn", batch=4, size={"width": 64}),
    "gpt": RealModel("gpt", "gpt", batch=2, size={"vocab": 8192, "context": 64, "width": 512, "layers": 8, "heads": 8}),
    # GPT-2 small's shape (124M parameters): what a GPU runs (the GPU check's FSDP2 stage).
    "gpt-124m": RealModel(
        "gpt-124m", "gpt", batch=4, size={"vocab": 50304, "context": 256, "width": 768, "layers": 12, "heads": 12}
    ),
    # Small enough for CI's few steps.
    "cnn-tiny": RealModel("cnn-tiny", "cnn", batch=4, size={"width": 8}),
    "gpt-tiny": RealModel(
        "gpt-tiny", "gpt", batch=2, size={"vocab": 512, "context": 16, "width": 32, "layers": 2, "heads": 2}
    ),
}


# -- emulated compute ----------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """One layer: its parameters' shapes and its forward FLOPs for one rank's batch."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    forward_flops: float


@dataclass(frozen=True)
class ShapedModel:
    """A published model's parameter shapes, layer by layer, and the batch its FLOPs are for."""

    name: str
    samples: int  # one rank's batch: images or sequences
    batch: str  # the same, for people
    layers: tuple[Layer, ...]

    @property
    def parameters(self) -> int:
        return sum(math.prod(shape) for layer in self.layers for shape in layer.shapes)

    @property
    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)


def _conv(out: int, inp: int, k: int, positions: int) -> tuple[tuple[int, ...], float]:
    """A bias-free convolution's weight and its FLOPs over `positions` output pixels."""
    return (out, inp, k, k), 2.0 * out * inp * k * k * positions


def resnet50(batch: int = 64) -> ShapedModel:
    """ResNet-50 (torchvision's layout): 25.6M parameters; 224x224 images."""
    layers = []
    shape, flops = _conv(64, 3, 7, 112 * 112 * batch)
    layers.append(Layer("stem", (shape, (64,), (64,)), flops))
    channels = 64
    for stage, (width, blocks, side) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), (56, 28, 14, 7), strict=True)):
        for block in range(blocks):
            positions = side * side * batch
            convs = [_conv(width, channels, 1, positions), _conv(width, width, 3, positions)]
            convs.append(_conv(4 * width, width, 1, positions))
            if block == 0:
                convs.append(_conv(4 * width, channels, 1, positions))  # the projection shortcut
            shapes: list[tuple[int, ...]] = []
            for (shape, _), out in zip(convs, (width, width, 4 * width, 4 * width), strict=False):
                shapes += [shape, (out,), (out,)]  # the convolution and its batch norm
            layers.append(Layer(f"layer{stage + 1}.{block}", tuple(shapes), sum(f for _, f in convs)))
            channels = 4 * width
    layers.append(Layer("fc", ((1000, 2048), (1000,)), 2.0 * 2048 * 1000 * batch))
    return ShapedModel("resnet50", batch, f"{batch} images of 224x224", tuple(layers))


def _transformer_block(width: int, tokens: int, context: int) -> tuple[tuple[tuple[int, ...], ...], float]:
    """Attention (q, k, v, output) and a 4x MLP, with biases and two layer norms."""
    shapes = (
        (3 * width, width), (3 * width,), (width, width), (width,),
        (4 * width, width), (4 * width,), (width, 4 * width), (width,),
        (width,), (width,), (width,), (width,),
    )  # fmt: skip
    matmul_params = 12 * width * width
    # 2 FLOPs per weight per token, and attention's scores and mixing: 4 x context x width per token.
    return shapes, 2.0 * matmul_params * tokens + 4.0 * context * width * tokens


def bert_base(batch: int = 32, context: int = 128) -> ShapedModel:
    """BERT-base: 110M parameters; the pooler and the tied masked-LM head included."""
    width, tokens = 768, batch * context
    layers = [Layer("embeddings", ((30522, width), (512, width), (2, width), (width,), (width,)), 0.0)]
    for index in range(12):
        shapes, flops = _transformer_block(width, tokens, context)
        layers.append(Layer(f"encoder.{index}", shapes, flops))
    layers.append(Layer("pooler", ((width, width), (width,)), 2.0 * width * width * batch))
    # The masked-LM head: a transform, its norm, and logits over the tied embedding.
    head = ((width, width), (width,), (width,), (width,), (30522,))
    layers.append(Layer("mlm_head", head, 2.0 * (width * width + 30522 * width) * tokens))
    return ShapedModel("bert-base", batch, f"{batch} sequences of {context} tokens", tuple(layers))


def gpt2_small(batch: int = 8, context: int = 1024) -> ShapedModel:
    """GPT-2 small: 124M parameters; the output head tied to the token embedding."""
    width, tokens = 768, batch * context
    layers = [Layer("embeddings", ((50257, width), (1024, width)), 0.0)]
    for index in range(12):
        shapes, flops = _transformer_block(width, tokens, context)
        layers.append(Layer(f"h.{index}", shapes, flops))
    # The final norm and the tied head's logits, which cost FLOPs but own no parameters of their own.
    layers.append(Layer("ln_f+head", ((width,), (width,)), 2.0 * 50257 * width * tokens))
    return ShapedModel("gpt2-small", batch, f"{batch} sequences of {context} tokens", tuple(layers))


SHAPED_MODELS = {"resnet50": resnet50, "bert-base": bert_base, "gpt2-small": gpt2_small}


class _SleepingLayer(torch.autograd.Function):
    """Forward and backward that take a set time and return constant gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, forward_s: float, backward_s: float, *weights: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.backward_s = backward_s
        ctx.shapes = [w.shape for w in weights]
        time.sleep(forward_s)
        return x + 0.0

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        time.sleep(ctx.backward_s)
        # One element expanded to each weight's shape: DDP copies it into its bucket like any gradient.
        one = torch.full((1,), 1e-3)
        return (grad, None, None, *(one.expand(shape) for shape in ctx.shapes))


class EmulatedNet(torch.nn.Module):
    """`model`'s parameters, each layer's compute replaced by its time scaled by `scale`."""

    def __init__(self, model: ShapedModel, flops_per_s: float, scale: float) -> None:
        super().__init__()
        self.layer_weights = torch.nn.ModuleList()
        self.times: list[tuple[float, float]] = []
        for layer in model.layers:
            holder = torch.nn.Module()
            for index, shape in enumerate(layer.shapes):
                holder.register_parameter(f"w{index}", torch.nn.Parameter(torch.zeros(shape)))
            self.layer_weights.append(holder)
            forward_s = layer.forward_flops / flops_per_s * scale
            self.times.append((forward_s, 2 * forward_s))  # backward: gradients of inputs and of weights
        self.compute_scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for holder, (forward_s, backward_s) in zip(self.layer_weights, self.times, strict=True):
            weights = list(holder.parameters())
            x = _SleepingLayer.apply(x, forward_s * self.compute_scale, backward_s * self.compute_scale, *weights)
        return x

    @property
    def compute_s(self) -> float:
        """The forward and backward time of one step, at the current compute scale."""
        return sum(f + b for f, b in self.times) * self.compute_scale
