"""ELECTRA as plain nn.Modules: embeddings, encoder, generator, discriminator and classification head.

Parameter names follow the Hugging Face ELECTRA layout exactly (``electra.encoder.layer.0.attention.self.query``
and so on), so a state dict moves between these modules and ``transformers`` without renaming. This file
holds no I/O; from the project it imports only the int8 simulation (training/quantization.py), which a
config with `quantization` set attaches to the encoder's projections.

Shapes in comments: B batch, T sequence, E embedding size, H hidden size, nh heads, hs head size, V vocab.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from training.dropout import Dropout
from training.embedding_grad import Embedding, lookup
from training.label_names import numbered_labels
from training.quantization import attach as attach_int8
from training.quantization import attach_storage


@dataclass
class ElectraConfig:
    """Model shape. Field names are those of Hugging Face's ElectraConfig, so config.json maps 1:1."""

    vocab_size: int = 30522
    embedding_size: int = 128  # factorized embeddings: E may be smaller than H (ELECTRA-Small: 128 vs 256)
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"  # exact (erf) GELU, as in the released checkpoints
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0  # null in some Hugging Face configs: no padding embedding
    # Only used by sequence classification.
    id2label: dict[int, str] = field(default_factory=lambda: {0: "LABEL_0", 1: "LABEL_1"})
    problem_type: str | None = None  # single_label_classification | multi_label_classification | regression
    classifier_dropout: float | None = None
    # Int8 projections with fixed activation ranges (training/quantization.py): set by quantization-aware
    # training or calibration; None is a plain fp32 model. Not a Hugging Face field (transformers ignores it).
    quantization: dict | None = None
    # The positions training has used (pretraining's --seq-len, fine-tuning's --max-seq-len, the larger
    # of its own and its start's): export's default --max-length, since a from-scratch model's positions
    # past them are as initialized. None: not known (an outside checkpoint), all count. Not a Hugging Face
    # field either.
    trained_positions: int | None = None
    # The length fine-tuning cut its rows to (--max-seq-len, special tokens in): a classifier's export
    # default --max-length, so its bundle truncates as the run's predictions_*.jsonl did. Ours alone.
    fine_tuned_length: int | None = None

    def __post_init__(self) -> None:
        self._check_types()
        self.id2label = numbered_labels(self.id2label)
        for name in ("num_attention_heads", "max_position_embeddings", "type_vocab_size", "vocab_size",
                     "embedding_size", "hidden_size", "num_hidden_layers", "intermediate_size"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(_ACTIVATIONS)}, got {self.hidden_act!r}")

    def _check_types(self) -> None:
        """Each field of the type its annotation says: a config.json edited by hand ("layer_norm_eps": "x",
        "embedding_size": null) failed at the first step, or in a comparison, far from the field."""
        for name, (kind, may_be_none) in _field_types().items():
            value = getattr(self, name)
            if value is None and may_be_none:
                continue
            whole = isinstance(value, int) and not isinstance(value, bool)
            if kind is int and not whole:
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if kind is float and not (whole or isinstance(value, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if kind in (str, dict) and not isinstance(value, kind):
                raise ValueError(f"{name} must be {'text' if kind is str else 'an object'}, got {value!r}")

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ElectraConfig:
        """Build from a config.json dict (ours or Hugging Face's); unknown HF keys are ignored."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if "id2label" not in kwargs and d.get("num_labels"):
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(int(d["num_labels"]))}
        return cls(**kwargs)

    def scaled(self, fraction: float) -> ElectraConfig:
        """A generator config: hidden, heads and FFN scaled by `fraction`, embeddings unchanged (they are shared)."""
        heads = max(1, round(self.num_attention_heads * fraction))
        hidden = max(heads, round(self.hidden_size * fraction / heads) * heads)
        return ElectraConfig(
            **{
                **self.to_dict(),
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "intermediate_size": max(1, round(self.intermediate_size * fraction)),
                "quantization": None,  # the generator is not exported: it trains in fp32
            }
        )


@functools.cache
def _field_types() -> dict[str, tuple[type, bool]]:
    """Each field's type as its annotation says it (dict[int, str] read as dict), and whether it may be
    None: read off the class, so a field added there is checked without a table to keep beside it."""
    out = {}
    for name, hint in typing.get_type_hints(ElectraConfig).items():
        kinds = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        kind = next(k for k in kinds if k is not type(None))
        kind = typing.get_origin(kind) or kind
        # A field of another type would pass unchecked: _check_types must learn it first.
        assert kind in (int, float, str, dict), f"ElectraConfig.{name}: no type check for {kind}"
        out[name] = (kind, type(None) in kinds)
    return out


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# transformers' names: gelu_new, gelu_pytorch_tanh and gelu_fast are one function (the tanh approximation)
# written three ways; silu and swish one too.
_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "gelu_new": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh,
                "gelu_fast": _gelu_tanh, "silu": F.silu, "swish": F.silu}  # fmt: skip


class ElectraEmbeddings(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.word_embeddings = Embedding(cfg.vocab_size, cfg.embedding_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = Embedding(cfg.max_position_embeddings, cfg.embedding_size)
        self.token_type_embeddings = Embedding(cfg.type_vocab_size, cfg.embedding_size)
        self.LayerNorm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """`token_type_ids` None: every token is of type 0 (one segment, as pretraining's packed rows). Its
        row is then looked up once and broadcast, so its gradient is a sum, not B x T rows added into one."""
        T = input_ids.size(1)
        positions = torch.arange(T, device=input_ids.device)
        types = token_type_ids if token_type_ids is not None else input_ids.new_zeros(1)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(types)
        x = x + self.position_embeddings(positions)  # (B, T, E)
        return self.dropout(self.LayerNorm(x))


class ElectraSelfAttention(nn.Module):
    fused = False  # one matrix product for q, k and v (see `fuse_qkv`)

    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.n_head = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.probs_dropout = Dropout(cfg.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        hs = H // self.n_head
        projections = (self.query, self.key, self.value)
        if self.fused and all(type(m) is nn.Linear for m in projections):  # int8-simulated ones stay apart
            weight = torch.cat([m.weight for m in projections])  # (3H, H): a copy of 3H^2, cheap beside x
            bias = torch.cat([m.bias for m in projections])
            qkv = F.linear(x, weight, bias).view(B, T, 3, self.n_head, hs)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, nh, T, hs) each
        else:
            q, k, v = (m(x).view(B, T, self.n_head, hs).transpose(1, 2) for m in projections)
        dropout = self.probs_dropout
        if self.training and dropout.p > 0 and dropout.bit_masks and x.device.type == "cpu":
            # With dropout, the CPU's SDPA takes its math path anyway: these products and softmax, but
            # with masks drawn one element at a time (training/dropout.py)
            scores = (q * hs**-0.5) @ k.transpose(-2, -1)  # scaling q's T x hs values, not T x T scores
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            y = dropout(scores.softmax(-1)) @ v
        else:
            p = dropout.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return y.transpose(1, 2).reshape(B, T, H)


def fuse_qkv(module: nn.Module, on: bool = True) -> None:
    """Compute each attention layer's q, k and v with one matrix product instead of three (one kernel,
    and under autocast one cast of the input). The parameters stay three Linears, so checkpoints keep the
    Hugging Face layout and export traces the graph ONNX Runtime's attention fusion recognises."""
    for m in module.modules():
        if isinstance(m, ElectraSelfAttention):
            m.fused = on


class ElectraSelfOutput(nn.Module):
    """Projection + residual + LayerNorm; the same shape serves attention output and FFN output."""

    def __init__(self, cfg: ElectraConfig, in_size: int):
        super().__init__()
        self.dense = nn.Linear(in_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class ElectraAttention(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.self = ElectraSelfAttention(cfg)
        self.output = ElectraSelfOutput(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, attn_mask), x)


class ElectraIntermediate(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class ElectraLayer(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.attention = ElectraAttention(cfg)
        self.intermediate = ElectraIntermediate(cfg)
        self.output = ElectraSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)


class ElectraEncoder(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.layer = nn.ModuleList(ElectraLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        for block in self.layer:
            x = block(x, attn_mask)
        return x


class ElectraModel(nn.Module):
    """The shared trunk: embeddings (+ projection when E != H) and the transformer encoder."""

    def __init__(self, cfg: ElectraConfig, embeddings: ElectraEmbeddings | None = None):
        super().__init__()
        # Passing `embeddings` shares the module (and so its parameters) with another model: ELECTRA's
        # generator and discriminator use one set of token and position embeddings.
        self.embeddings = embeddings if embeddings is not None else ElectraEmbeddings(cfg)
        if cfg.embedding_size != cfg.hidden_size:
            self.embeddings_project = nn.Linear(cfg.embedding_size, cfg.hidden_size)
        self.encoder = ElectraEncoder(cfg)
        if cfg.quantization is not None:
            attach_int8(self, cfg.quantization)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder's input: embeddings, projected to the hidden size when E != H. (B, T, H)"""
        x = self.embeddings(input_ids, token_type_ids)
        return self.embeddings_project(x) if hasattr(self, "embeddings_project") else x

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed(input_ids, token_type_ids)
        # Boolean key mask, broadcast over heads and queries: (B, 1, 1, T); True = may attend. Without one
        # (rows with no padding) attention may take its fused kernels, which refuse a mask.
        attn_mask = attention_mask.bool()[:, None, None, :] if attention_mask is not None else None
        return self.encoder(x, attn_mask)  # (B, T, H)


class ElectraDiscriminatorPredictions(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.dense_prediction = nn.Linear(cfg.hidden_size, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(h))).squeeze(-1)  # (B, T) logits


class ElectraForPreTraining(nn.Module):
    """The discriminator: one logit per token, > 0 meaning "replaced"."""

    def __init__(self, cfg: ElectraConfig, embeddings: ElectraEmbeddings | None = None):
        super().__init__()
        self.config = cfg
        self.electra = ElectraModel(cfg, embeddings)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(cfg)
        if cfg.quantization is not None:  # the bundle's int8 storage, simulated (training/quantization.py)
            attach_storage(self)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.discriminator_predictions(self.electra(input_ids, attention_mask, token_type_ids))


class ElectraGeneratorPredictions(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_size)
        self.LayerNorm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(h)))


class ElectraForMaskedLM(nn.Module):
    """The generator (or the MLM baseline): output layer tied to the input word embeddings."""

    opaque_grad = True  # the rows at `positions` gathered by embedding_grad.lookup; False: index_select

    def __init__(self, cfg: ElectraConfig, embeddings: ElectraEmbeddings | None = None):
        super().__init__()
        self.config = cfg
        self.electra = ElectraModel(cfg, embeddings)
        self.generator_predictions = ElectraGeneratorPredictions(cfg)
        self.generator_lm_head = nn.Linear(cfg.embedding_size, cfg.vocab_size)
        self.generator_lm_head.weight = self.electra.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, positions=None) -> torch.Tensor:
        """Logits over the vocabulary: (B, T, V), or (C, V) at `positions`, flat indices (row * T +
        column) into the batch's positions.

        The V-wide output layer dominates the generator's cost, so pretraining asks for the masked
        positions only (15% of tokens), as a fixed number of them: the shape never depends on the data.
        """
        h = self.electra(input_ids, attention_mask, token_type_ids)  # (B, T, Hg)
        if positions is not None:
            # Unused slots repeat one position. index_select's gradient is an accumulating index_put,
            # which deterministic kernels run as aten's sorted fallback: a serial walk over the repeats.
            flat = h.flatten(0, 1)
            h = lookup(flat, positions) if self.opaque_grad else flat.index_select(0, positions)  # (C, Hg)
        return self.generator_lm_head(self.generator_predictions(h))


class ElectraClassificationHead(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        p = cfg.classifier_dropout if cfg.classifier_dropout is not None else cfg.hidden_dropout_prob
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = Dropout(p)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.dropout(h[:, 0])  # the [CLS] position, (B, H)
        x = self.dropout(F.gelu(self.dense(x)))  # GELU, not tanh: as ELECTRA's released fine-tuning code
        return self.out_proj(x)  # (B, num_labels)


class ElectraForSequenceClassification(nn.Module):
    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.config = cfg
        self.electra = ElectraModel(cfg)
        self.classifier = ElectraClassificationHead(cfg)
        if cfg.quantization is not None:
            attach_storage(self)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.classifier(self.electra(input_ids, attention_mask, token_type_ids))


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT initialization (truncation aside): N(0, std) weights, zero biases, unit LayerNorm.

    Embeddings go last: a tied output layer is an nn.Linear holding the embedding matrix, and its
    initialization must not undo the zeroed padding row.
    """
    modules = list(module.modules())
    for m in modules:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in modules:
        if isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()


def flops_per_token(cfg: ElectraConfig, seq_len: int, lm_head_fraction: float | None = None) -> float:
    """Training FLOPs per token (forward + backward = 3x forward, 2 FLOPs per multiply-add).

    Counts the matrix multiplies: embedding projection, attention projections and scores, FFN, and the
    output head. `lm_head_fraction` is the share of positions that go through the V-wide MLM output
    layer (the mask rate for our generator; None for a discriminator, whose head is H x H + H x 1). The
    step runs that layer on every slot of its fixed capacity of masked positions (about 17-23% of positions
    with the shipped configs), padding slots included: metrics.jsonl's `tflops` counts the useful work, a
    little under what the device computed.
    """
    H, E, L, V = cfg.hidden_size, cfg.embedding_size, cfg.num_hidden_layers, cfg.vocab_size
    per_layer = 4 * H * H + 2 * H * cfg.intermediate_size + 2 * H * seq_len  # q,k,v,o + FFN + QK^T and AV
    macs = L * per_layer + (E * H if E != H else 0)
    if lm_head_fraction is None:
        macs += H * H + H
    else:
        macs += lm_head_fraction * (H * E + E * V)
    return 3 * 2 * macs


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


__all__ = [
    "ElectraConfig",
    "ElectraForMaskedLM",
    "ElectraForPreTraining",
    "ElectraForSequenceClassification",
    "ElectraModel",
    "count_parameters",
    "flops_per_token",
    "fuse_qkv",
    "init_weights",
]
