"""megalab's GPT layer spec for Megatron-Core without Transformer Engine or apex.

Why this exists. A Megatron "spec" says which module class builds each piece of a transformer
layer. Without TE and apex the only built-in choice is `--transformer-impl local`, and its spec
has two problems for real runs:

* Its core attention (`DotProductAttention`) materialises the full [b, heads, s, s] score matrix
  in memory: O(s^2) activations, which dominate at long sequence lengths.
* Its norms (`WrappedTorchNorm`, plain torch LayerNorm/RMSNorm) refuse `--sequence-parallel`.

This spec keeps everything else exactly as the local spec has it (same TransformerLayer,
SelfAttention, Column/RowParallelLinear, MLP or MoE, same parameter names, so parameter counts and
checkpoints match) and swaps in:

* `SDPAttention`: `torch.nn.functional.scaled_dot_product_attention`, which picks a fused kernel
  (FlashAttention, cuDNN or memory-efficient) that never stores the s x s matrix.
* Context parallelism (`--context-parallel-size`, all three `--cp-comm-type` modes p2p,
  all_gather, a2a) in `SDPAttention`, from megalab/runtime/cp_attention.py: Megatron has CP only inside
  Transformer Engine's attention.
* `Norm`: LayerNorm/RMSNorm that marks its parameters `sequence_parallel`, the contract Megatron's
  own SP-capable norms follow, so `finalize_model_grads` sums their gradients over the TP group.
  It is also the final norm of the block.
* `GroupedMLP` MoE experts (megalab/runtime/grouped_experts.py) when the `grouped_gemm` fast-path lever
  is on (or Megatron's --moe-grouped-gemm): SequentialMLP's parameters, computed with
  `torch._grouped_mm` instead of a loop over the experts. Megatron's grouped experts need TE.
* The bias-dropout-adds: Megatron's own, or with the dropout_add lever megalab's Triton kernels
  (megalab/runtime/dropout_add.py), asked at every call.

Use it with `--transformer-impl local --spec megalab.runtime.spec megalab_layer_spec`, and keep
`--attention-backend` off `local` (Megatron then swaps its own attention back in).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Optional

from megalab._compat import ensure_typing_override

ensure_typing_override()

from megalab.runtime import cp_attention, dropout_add, grouped_experts, levers, liger_norm, moe_dispatch, triton_norm  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.models.backends import LocalSpecProvider  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec  # noqa: E402
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend  # noqa: E402
from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.tensor_parallel.layers import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
)
from megatron.core.transformer.attention import (  # noqa: E402
    SelfAttention,
    SelfAttentionSubmodules,
)
from megatron.core.transformer.enums import AttnMaskType, LayerType  # noqa: E402
from megatron.core.transformer.identity_op import IdentityOp  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.torch_norm import L2Norm  # noqa: E402
from megatron.core.transformer.transformer_block import (  # noqa: E402
    TransformerBlock,
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from megatron.core.transformer.transformer_layer import (  # noqa: E402
    TransformerLayer,
    TransformerLayerSubmodules,
    get_transformer_layer_offset,
)
from megatron.core.transformer.utils import is_layer_window_attention  # noqa: E402
from megatron.core.utils import divide  # noqa: E402

__all__ = ["SDPAttention", "Norm", "megalab_layer_spec", "megalab_transformer_layer_spec"]



class SDPAttention(MegatronModule):
    """Core attention through `torch.nn.functional.scaled_dot_product_attention`.

    A drop-in for Megatron's `DotProductAttention` (same constructor and forward signature):
    query/key/value arrive as [sq, b, heads_per_tp_rank, head_dim] (key/value may carry fewer
    heads: grouped-query attention), the output is [sq, b, heads_per_tp_rank * head_dim].

    Masks. Megatron's boolean masks are True where attention is *forbidden*; SDPA's are True
    where it is *allowed*, so they are inverted. For the causal mask type the `attention_mask`
    argument is ignored and SDPA's `is_causal=True` is used (as Transformer Engine does), which
    keeps the flash kernel eligible; so `--reset-attention-mask` document masking has no effect.
    A query row whose keys are all masked (a padding query) attends to every key instead, so its
    output stays finite; Megatron's softmax gives a uniform average there. Either way the loss
    mask drops such rows.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Optional[ProcessGroupCollection] = None,
    ):
        super().__init__(config=config)
        self.config: TransformerConfig = config

        if config.softmax_type != "vanilla":
            raise NotImplementedError(
                f"SDPAttention supports softmax_type='vanilla' only, got {config.softmax_type!r}"
            )
        if is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, layer_number
        ):
            raise NotImplementedError("SDPAttention does not support sliding-window attention")

        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type

        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        world_size = pg_collection.tp.size()

        # Context parallelism (megalab/runtime/cp_attention.py): Megatron's own CP lives only in TE's
        # attention (DotProductAttention asserts "only supported by TEDotProductAttention").
        # TransformerLayer passes config.cp_comm_type in as cp_comm_type when CP > 1.
        self.cp_size = config.context_parallel_size
        self.cp_group = getattr(pg_collection, "cp", None) if self.cp_size > 1 else None
        if self.cp_size > 1 and self.cp_group is None:
            self.cp_group = parallel_state.get_context_parallel_group()
        self.cp_comm_type = cp_comm_type or "p2p"
        if self.cp_size > 1 and self.cp_comm_type not in cp_attention.MODES:
            raise NotImplementedError(
                f"megalab's context parallelism has cp_comm_type {', '.join(cp_attention.MODES)}, not "
                f"{self.cp_comm_type!r}; fix: --cp-comm-type p2p (or all_gather, a2a)")

        projection_size = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection_size, world_size)
        self.hidden_size_per_attention_head = divide(projection_size, config.num_attention_heads)
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, world_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, world_size)

        # Same scale as DotProductAttention. With apply_query_key_layer_scaling it divides the
        # scale by layer_number and multiplies the scores back by layer_number inside its fp32
        # softmax (an fp16 overflow trick); the two cancel, so the effective scale is this one.
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head)
        self.softmax_scale = softmax_scale

        self.attention_dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )
        if self.cp_size > 1 and self.cp_comm_type == "p2p" and self.attention_dropout_p > 0:
            raise NotImplementedError(
                "megalab's ring attention (cp_comm_type p2p) has no attention dropout; "
                "fix: add --attention-dropout 0, or use --cp-comm-type all_gather or a2a")

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        """[sq, b, np, hn] x3 -> [sq, b, np * hn]."""
        if packed_seq_params is not None:
            raise NotImplementedError(
                "SDPAttention does not support packed sequences (packed_seq_params); "
                "use unpacked [s, b] batches"
            )
        if attention_bias is not None:
            raise NotImplementedError("SDPAttention does not support attention_bias")

        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        sq, b, nq, _ = query.shape
        sk, nkv = key.size(0), key.size(2)

        # Grouped-query attention. By default each K/V group is repeated for the query heads that share
        # it (as DotProductAttention does): every SDPA kernel takes that. With the sdpa_gqa lever
        # the kernel reads the shared K/V head itself (enable_gqa=True): no copies of K
        # and V forward, no sums of their gradients backward. cuDNN's and flash's kernels take it; the
        # ring/all-gather paths of context parallelism keep the copies.
        gqa = nq != nkv and levers.on(levers.SDPA_GQA) and self.cp_size == 1
        if nq != nkv and not gqa:
            key = key.repeat_interleave(nq // nkv, dim=2)
            value = value.repeat_interleave(nq // nkv, dim=2)

        # [s, b, n, h] -> [b, n, s, h] (a view: the head dim stays contiguous, as SDPA needs).
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))

        if self.cp_size > 1:
            return self._context_parallel(q, k, v, mask_type, attention_mask)

        causal = mask_type in (
            AttnMaskType.causal, AttnMaskType.causal_bottom_right, AttnMaskType.padding_causal
        )
        explicit = None  # Megatron convention: True = masked out
        if mask_type in (AttnMaskType.padding, AttnMaskType.padding_causal, AttnMaskType.arbitrary):
            explicit = attention_mask
        is_causal = causal and explicit is None and sq == sk
        attn_mask = None
        if not is_causal:
            if explicit is not None:
                attn_mask = ~explicit.to(torch.bool)  # SDPA convention: True = may attend
            if causal and sq > 1:
                # Causal with sq != sk (KV-cache prefill) or combined with a padding mask:
                # query i sits at position sk - sq + i (bottom-right aligned). With sq == 1
                # (decoding) the one query may see every key: no causal part.
                tri = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
                attn_mask = tri if attn_mask is None else attn_mask & tri
            if explicit is not None:
                # A query row with every key masked (a padding query) would get zeros or NaN
                # depending on the kernel, and NaN survives the loss mask (NaN * 0). Let such
                # rows see all keys instead: finite, and like Megatron's -10000 fill, ignored.
                attn_mask = attn_mask | ~attn_mask.any(dim=-1, keepdim=True)

        dropout_p = self.attention_dropout_p if self.training else 0.0
        if dropout_p > 0.0 and not self.config.sequence_parallel:
            # Like DotProductAttention: heads differ per TP rank, so draw dropout from the
            # model-parallel RNG stream.
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                    is_causal=is_causal, scale=self.softmax_scale, enable_gqa=gqa,
                )
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=self.softmax_scale, enable_gqa=gqa,
            )

        # [b, n, sq, h] -> [sq, b, n * h]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


    def _context_parallel(self, q, k, v, mask_type, attention_mask) -> Tensor:
        """This rank's 2 of 2*CP sequence chunks attend over the whole sequence (cp_attention.py).

        Only the plain causal mask is supported: it is what GPT pre-training uses, and each mode
        builds it from the chunks' positions (the `attention_mask` argument is ignored, as in the
        CP-free causal path).
        """
        if mask_type != AttnMaskType.causal:
            raise NotImplementedError(
                f"megalab's context parallelism supports the causal mask only, got {mask_type.name}; "
                "fix: drop padding/arbitrary masks or run without --context-parallel-size")
        dropout_p = self.attention_dropout_p if self.training else 0.0
        sq = q.size(2)
        with tensor_parallel.get_cuda_rng_tracker().fork() if dropout_p else contextlib.nullcontext():
            out = cp_attention.attention(q, k, v, self.cp_comm_type, self.cp_group,
                                         self.softmax_scale, dropout_p)
        return out.permute(2, 0, 1, 3).reshape(sq, q.size(0), self.hidden_size_per_partition)


class Norm(torch.nn.Module):
    """LayerNorm or RMSNorm (config.normalization) that works with sequence parallelism.

    Under sequence parallelism each TP rank normalises a different slice of the sequence, so each
    rank's gradient for the (replicated) weight/bias is only a partial sum. Megatron's SP-capable
    norms (apex FusedLayerNorm, TENorm) set `param.sequence_parallel = config.sequence_parallel`;
    `finalize_model_grads` (`_allreduce_non_tensor_model_parallel_grads`) then all-reduces (sums)
    the gradients of every parameter so marked across the tensor-parallel group. This class does
    the same. The forward is plain `F.layer_norm` / `F.rms_norm`, or with triton_norm megalab's own Triton
    kernels (megalab/runtime/triton_norm.py), or with liger_norm liger-kernel's (megalab/runtime/liger_norm.py).

    Parameters are `weight` (and `bias` for LayerNorm), named as in torch.nn.LayerNorm/RMSNorm, so
    checkpoints match the local spec's norms. With `layernorm_zero_centered_gamma` the weight is
    stored as gamma - 1 (initialised to zero) and the forward uses weight + 1.
    """

    def __init__(
        self,
        config: TransformerConfig,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: Optional[str] = None,
    ):
        super().__init__()
        self.config = config
        self.normalization = normalization or config.normalization
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(
                f"megalab Norm supports LayerNorm and RMSNorm, got {self.normalization!r}"
            )
        self.hidden_size = (hidden_size,)
        self.eps = eps
        self.zero_centered_gamma = config.layernorm_zero_centered_gamma or zero_centered_gamma

        factory = dict(dtype=config.params_dtype)
        fill = torch.zeros if self.zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(fill(hidden_size, **factory))
        if self.normalization == "LayerNorm":
            self.bias = torch.nn.Parameter(torch.zeros(hidden_size, **factory))
        else:
            self.register_parameter("bias", None)

        # The SP contract (see class docstring): exactly what FusedLayerNorm does.
        for p in (self.weight, self.bias):
            if p is not None:
                setattr(p, "sequence_parallel", config.sequence_parallel)
        self.gives_residual = False  # (output, residual): ResidualNorm (below), a TransformerLayer's two norms

    def reset_parameters(self) -> None:
        """Reinitialise: gamma = 1 (stored as 0 when zero-centred), beta = 0."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        if triton_norm.takes(x):  # the triton_norm lever (its file)
            if self.gives_residual and levers.on(levers.NORM_RESIDUAL):  # the norm_residual lever: (output, residual)
                return triton_norm.norm_residual(x, self.weight, self.bias, self.eps,
                                                 self.normalization == "RMSNorm", self.zero_centered_gamma)
            return triton_norm.norm(x, self.weight, self.bias, self.eps, self.normalization == "RMSNorm",
                                    self.zero_centered_gamma)
        if liger_norm.takes(x):  # the liger_norm lever (its file)
            return liger_norm.norm(x, self.weight, self.bias, self.eps, self.normalization == "RMSNorm",
                                   self.zero_centered_gamma)
        weight = self.weight + 1 if self.zero_centered_gamma else self.weight
        if self.normalization == "LayerNorm":
            return F.layer_norm(x, self.hidden_size, weight, self.bias, self.eps)
        return F.rms_norm(x, self.hidden_size, weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalization}, {self.hidden_size}, eps={self.eps}"


class ResidualNorm(Norm):
    """A TransformerLayer's input_layernorm or pre_mlp_layernorm: with the norm_residual lever (and triton_norm)
    it returns (output, residual), the pair Megatron's layer accepts from its norm (transformer_layer.py takes its
    residual from it), so the residual branch's gradient comes back into the norm's backward kernel and is added
    there, not in a pass of autograd's own (megalab/runtime/triton_norm.py, _NormResidual). Where the layer
    recomputes or offloads its norms, Megatron's wrappers around the norm expect one tensor: it returns one."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs):
        super().__init__(config, hidden_size, eps, **kwargs)
        recomputed = (config.recompute_granularity == "selective"
                      and "layernorm" in (config.recompute_modules or ()))
        offloaded = bool(getattr(config, "fine_grained_activation_offloading", False))
        self.gives_residual = not (recomputed or offloaded)


def _transformer_config(config) -> TransformerConfig:
    """Megatron hands the spec function a GPTModelConfig; its `.transformer` is the real config."""
    inner = getattr(config, "transformer", None)
    return inner if isinstance(inner, TransformerConfig) else config


class _GroupedExpertsBackend(LocalSpecProvider):
    """Megatron's local backend, except that asking it for grouped-GEMM experts gives megalab's
    GroupedMLP (the local backend itself answers SequentialMLP: its grouped experts need TE)."""

    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool):
        if moe_use_grouped_gemm:
            return grouped_experts.experts_builder()
        return super().grouped_mlp_modules(moe_use_grouped_gemm)


def _moe_layer(mlp):
    """A MoE layer's builder with megalab's MoELayer (Megatron's, whose dispatcher the moe_gather lever may swap for
    megalab/runtime/moe_dispatch.py's); a dense MLP's spec as it is."""
    if isinstance(mlp, functools.partial) and mlp.func is moe_dispatch.MoELayer.__mro__[1]:
        return functools.partial(moe_dispatch.MoELayer, *mlp.args, **mlp.keywords)
    return mlp


def megalab_transformer_layer_spec(
    num_experts: Optional[int] = None,
    moe_grouped_gemm: bool = False,
    qk_layernorm: bool = False,
    qk_l2_norm: bool = False,
) -> ModuleSpec:
    """One TransformerLayer: Megatron's local layer spec with SDPAttention and Norm swapped in.

    Mirrors `get_gpt_layer_local_submodules` (non-MLA branch) line for line otherwise. With
    `moe_grouped_gemm` the MoE experts are megalab's GroupedMLP (torch._grouped_mm; same
    parameters as SequentialMLP), where Megatron's local spec would still build SequentialMLP.
    """
    if qk_l2_norm:
        qk_norm = L2Norm
    elif qk_layernorm:
        qk_norm = Norm
    else:
        qk_norm = IdentityOp
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=ResidualNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear,
                    core_attention=SDPAttention,
                    linear_proj=RowParallelLinear,
                    q_layernorm=qk_norm,
                    k_layernorm=qk_norm,
                ),
            ),
            self_attn_bda=dropout_add.get_bias_dropout_add,
            pre_mlp_layernorm=ResidualNorm,
            # Dense MLP or, with num_experts, Megatron's local MoE layer (its router and token
            # dispatcher) with SequentialMLP or, with moe_grouped_gemm, GroupedMLP experts.
            mlp=_moe_layer(
                get_moe_module_spec_for_backend(
                    backend=_GroupedExpertsBackend(), num_experts=num_experts, moe_grouped_gemm=True
                )
                if num_experts is not None and moe_grouped_gemm
                else get_mlp_module_spec(use_te=False, num_experts=num_experts)
            ),
            mlp_bda=dropout_add.get_bias_dropout_add,
            # Same key remapping as the local spec, so distributed checkpoints are interchangeable.
            sharded_state_dict_keys_map={
                "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
            },
        ),
    )


def megalab_layer_spec(config, vp_stage: Optional[int] = None) -> ModuleSpec:
    """The `--spec megalab.runtime.spec megalab_layer_spec` entry point: a TransformerBlock spec.

    It returns a *block* spec rather than a single-layer spec because, given a layer spec,
    TransformerBlock picks the final norm itself (`transformer_block.LayerNormImpl`, which is
    WrappedTorchNorm without TE/apex and refuses sequence parallelism). The block spec names
    `Norm` as the final norm and lists this pipeline stage's layers, dense or MoE per
    `moe_layer_freq`, sliced as Megatron's `get_gpt_decoder_block_spec` does.
    """
    cfg = _transformer_config(config)
    levers.mark_spec_levers_asked()  # Megatron-LM's own pretrain_gpt.py (MEGATRON_LM=) calls no fastpath.apply
    if cfg.multi_latent_attention:
        raise NotImplementedError("megalab_layer_spec does not support multi-latent attention")
    if cfg.experimental_attention_variant is not None:
        raise NotImplementedError("megalab_layer_spec does not support experimental attention")
    if cfg.mtp_num_layers:
        # Megatron builds MTP layers from its own local spec whatever --spec says.
        raise NotImplementedError("megalab_layer_spec does not support multi-token prediction")

    qk = dict(qk_layernorm=bool(cfg.qk_layernorm), qk_l2_norm=bool(cfg.qk_l2_norm))
    dense = megalab_transformer_layer_spec(**qk)
    if cfg.num_moe_experts is None:
        layer_specs = [dense] * cfg.num_layers
    else:
        # Grouped-GEMM experts with the grouped_gemm lever (the launcher's
        # substitute for the preset's moe_grouped_gemm without TE) or --moe-grouped-gemm is set.
        moe = megalab_transformer_layer_spec(
            num_experts=cfg.num_moe_experts,
            moe_grouped_gemm=grouped_experts.wanted(bool(cfg.moe_grouped_gemm)),
            **qk,
        )
        freq = cfg.moe_layer_freq
        if isinstance(freq, int):  # one MoE layer every `freq` layers, starting with the first
            pattern = [int(i % freq == 0) for i in range(cfg.num_layers)]
        else:  # an explicit 0/1 list
            pattern = list(freq)
        if len(pattern) != cfg.num_layers:
            raise ValueError(f"moe_layer_freq {freq} does not cover {cfg.num_layers} layers")
        layer_specs = [moe if is_moe else dense for is_moe in pattern]

    # This pipeline stage's layers (same slicing as get_gpt_decoder_block_spec).
    if cfg.pipeline_model_parallel_layout is not None:
        ids = cfg.pipeline_model_parallel_layout.get_layer_id_list(
            layer_type=LayerType.decoder, vp_stage=vp_stage
        )
        local_specs = [layer_specs[i] for i in ids]
    else:
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        n = get_num_layers_to_build(cfg, vp_stage=vp_stage, pp_rank=pp_rank)
        offset = get_transformer_layer_offset(cfg, vp_stage=vp_stage, pp_rank=pp_rank)
        local_specs = layer_specs[offset : offset + n]

    return ModuleSpec(
        module=TransformerBlock,
        submodules=TransformerBlockSubmodules(layer_specs=local_specs, layer_norm=Norm),
    )
