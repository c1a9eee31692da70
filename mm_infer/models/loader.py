"""Load HF safetensors checkpoints (legacy and new tensor names) into the model of their family (QwenVLModel,
NemotronOmniModel); in-place refits."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from mm_infer.parallel.group import RankGroup

from mm_infer.models.config import ModelConfig, load_config
from mm_infer.models.errors import MissingTensorError, ShapeMismatchError, UnexpectedTensorError
from mm_infer.models.qwen_names import EXPERTS, FUSED_PARTS, PATCH_EMBED, hf_target, hf_to_internal
from mm_infer.models.qwen_vl import QwenVLModel
from mm_infer.models.safetensors_map import adjacent_span, checkpoint_files, map_file, tensor_names
from mm_infer.parallel.plan import local_config, shard_model
from mm_infer.parallel.shard_spec import shard_of

log = logging.getLogger(__name__)
LM_HEAD, EMBED = "lm_head.weight", "language.embed_tokens.weight"
def target_view(model: torch.nn.Module, params: Mapping[str, Tensor], name: str, part: int | None) -> Tensor:
    """The parameter, or the rows of one part of a fused parameter, that a checkpoint tensor fills."""
    param = params[name]
    if part is None:
        return param
    module_path, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_path)
    if hasattr(module, "part_view"):
        return module.part_view(leaf, param, part)
    start, rows = module.part_rows(part)
    return param.narrow(0, start, rows)


def _part_count(model: torch.nn.Module, name: str) -> int:
    module_path, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_path)
    return module.part_count(leaf) if hasattr(module, "part_count") else len(module.part_sizes)


def _fused_complete(model: torch.nn.Module, parts: Mapping[str, Mapping[int, Tensor | None]]) -> set[str]:
    return {name for name, got in parts.items() if len(got) == _part_count(model, name)}


def stored_shape(model: torch.nn.Module, params: Mapping[str, Tensor], name: str, part: int | None
                 ) -> tuple[int, ...]:
    """The shape of the view a stored tensor fills, as the checkpoint has it: this rank's view, widened back to the
    whole tensor when the parameter is sharded over tensor-parallel ranks."""
    view = tuple(target_view(model, params, name, part).shape)
    spec = shard_of(model, name)
    return view if spec is None else spec.stored_shape(view, part)


def _conversion(name: str, shape: tuple[int, ...], want: tuple[int, ...]) -> str | None:
    """How a stored tensor of `shape` fills a parameter (view) of shape `want`: copy, flatten, transpose or None."""
    if shape == want:
        return "copy"
    if name == PATCH_EMBED and prod(shape) == prod(want):
        return "flatten"  # Conv3d [D, C, T, ph, pw] -> [D, C*T*ph*pw]
    if name.endswith(EXPERTS) and len(shape) == 3 and (shape[0], shape[2], shape[1]) == want:
        return "transpose"  # the hub's fused experts; transformers keeps a tensor that already fits as is
    if len(want) == len(shape) + 1 and want[0] == 1 and want[1:] == shape:
        return "flatten"  # one expert's tensor into its row of a stacked [E, ...] parameter
    return None


def tensor_fits(name: str, shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether a stored tensor of `shape` can fill our parameter `name` of shape `want` (for refit planning)."""
    return _conversion(name, tuple(shape), tuple(want)) is not None


def load_state_dict_into(
    model: QwenVLModel, named_tensors: Iterable[tuple[str, Tensor]] | Mapping[str, Tensor], *, strict: bool = False,
    adopt: bool = False,
) -> set[str]:
    """Copy HF-named tensors into model parameters in place (dtype/device converted); returns names filled.

    strict=True additionally requires every parameter to be filled. Unknown names always raise, except
    lm_head.weight on a tied model (a refit from a trainer may send it; load_model settles ties first).
    adopt=True (loading from memory-mapped files) makes a parameter share tensors already of its dtype, device and
    shape instead of copying them: a whole tensor, or the parts of a fused parameter that lie back to back in one
    file (gate_proj, up_proj). The file's pages are then read on first use, and a later in-place refit writes
    private copies of them.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    params = loadable_tensors(model)
    filled: set[str] = set()
    parts: dict[str, dict[int, Tensor | None]] = {}  # fused parameters: parts seen (adopt: their tensors)
    target_of = tensor_target(model)
    with torch.no_grad():
        for hf_name, tensor in items:
            target = target_of(hf_name)
            if target is None or (target[0] == "lm_head.weight" and getattr(model, "lm_head", 0) is None):
                continue
            name, part = target
            if name not in params:
                raise UnexpectedTensorError(f"checkpoint tensor {hf_name!r} maps to no parameter ({name!r})")
            view, tensor = _fitted(model, params, hf_name, name, part, tensor)
            if part is not None:  # adopt: filled once every part is in; else copied now (a refit keeps nothing)
                if not adopt:
                    view.copy_(tensor)
                parts.setdefault(name, {})[part] = tensor if adopt else None
                continue
            if adopt and _adoptable(tensor, view):
                view.data = tensor
            else:
                view.copy_(tensor)  # one copy, converting dtype and device on the way
            filled.add(name)
        if adopt:
            _fill_fused(model, params, parts)
    filled |= _fused_complete(model, parts)
    if strict and (missing := _missing_names(model, set(params) - filled, parts)):
        raise MissingTensorError(f"checkpoint lacks tensors for {len(missing)} parameters, e.g. {missing[:5]}")
    return filled


def _fitted(model: QwenVLModel, params: Mapping[str, Tensor], hf_name: str, name: str, part: int | None,
            tensor: Tensor) -> tuple[Tensor, Tensor]:
    """(the parameter or part view the tensor fills, the tensor reshaped to fit it); ShapeMismatchError if none."""
    view = target_view(model, params, name, part)
    spec = shard_of(model, name)
    want = tuple(view.shape) if spec is None else spec.stored_shape(tuple(view.shape), part)
    how = _conversion(name, tuple(tensor.shape), want)
    if how is None:
        raise ShapeMismatchError(f"tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {want}")
    if how != "copy":
        tensor = tensor.reshape(want) if how == "flatten" else tensor.transpose(1, 2)
    return view, tensor if spec is None else spec.take(tensor, part)


def _fill_fused(model: QwenVLModel, params: Mapping[str, Tensor],
                parts: Mapping[str, Mapping[int, Tensor | None]]) -> None:
    """Each fused parameter shares its parts' storage when they lie back to back in part order, else copies them."""
    for name, got in parts.items():
        count = _part_count(model, name)
        param = params[name]
        whole = len(got) == count and not hasattr(model.get_submodule(name.rpartition(".")[0]), "part_view")
        span = adjacent_span([got[i] for i in range(count)]) if whole else None
        if span is not None and _adoptable(span, param):
            param.data = span
            continue
        for part, tensor in got.items():
            target_view(model, params, name, part).copy_(tensor)


def _adoptable(tensor: Tensor, param: Tensor) -> bool:
    return (tensor.dtype == param.dtype and tensor.device == param.device and tensor.shape == param.shape
            and tensor.is_contiguous())


def _missing_names(model: torch.nn.Module, unfilled: set[str],
                   parts: Mapping[str, Mapping[int, Tensor | None]]) -> list[str]:
    """Unfilled parameters by the names a checkpoint would use: fused ones as their missing parts."""
    by_part = {(fused, part): hf for hf, (fused, part) in FUSED_PARTS.items()}
    names = []
    for name in sorted(unfilled):
        module_path, _, leaf = name.rpartition(".")
        parent, _, module = module_path.rpartition(".")
        owner = model.get_submodule(module_path)
        if not hasattr(owner, "part_sizes") and not hasattr(owner, "part_count"):
            names.append(name)
            continue
        got = parts.get(name, {})
        names += [f"{parent}.{by_part[(module, i)]}.{leaf}" if (module, i) in by_part else f"{name}[{i}]"
                  for i in range(_part_count(model, name)) if i not in got]
    return names


def iter_safetensors(model_dir: str | Path) -> Iterable[tuple[str, Tensor]]:
    """(name, tensor) of every *.safetensors file in model_dir, each a view of its file's private map."""
    for path in checkpoint_files(model_dir):
        yield from map_file(path)


def loadable_tensors(model: torch.nn.Module) -> dict[str, Tensor]:
    """What a checkpoint fills: every parameter and every persistent buffer (batch-norm statistics)."""
    return dict(model.named_parameters()) | dict(model.state_dict(keep_vars=True).items())


def materialize(model: torch.nn.Module, dtype: torch.dtype, device: str | torch.device) -> None:
    """Give every (meta) parameter and buffer uninitialised storage (buffers that are not floating point keep their
    dtype); avoids to_empty, whose meta path imports sympy."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=dtype, device=device), requires_grad=False
                )
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=dtype if b.is_floating_point() else b.dtype,
                                                    device=device)


def _renamed(tensors: Iterable[tuple[str, Tensor]], old: str, new: str) -> Iterator[tuple[str, Tensor]]:
    for name, tensor in tensors:
        yield (new if name == old else name), tensor


def _settle_tie(model: QwenVLModel, config: ModelConfig) -> ModelConfig:
    """A tied config whose checkpoint stores both embeddings and lm_head: tie when equal, else keep both (with
    transformers' warning), as PreTrainedModel.tie_weights does; the model was built untied to load both."""
    if torch.equal(model.lm_head.weight, model.language.embed_tokens.weight):
        model.lm_head = None
        return config
    log.warning("config ties word embeddings, but the checkpoint's lm_head.weight differs from its embeddings: "
                "loaded untied, as transformers does")
    return replace(config, tie_word_embeddings=False)


def model_class(config: ModelConfig) -> type[torch.nn.Module]:
    """The model class of a config's family."""
    if config.kind == "nemotron_h_omni":
        from mm_infer.models.nemotron_omni import NemotronOmniModel

        return NemotronOmniModel
    return QwenVLModel


def tensor_target(model: torch.nn.Module):  # noqa: ANN201 - (str) -> (name, part) | None
    """The model family's stored-name mapping (hf_target for the Qwen families)."""
    return getattr(model, "tensor_target", hf_target)


def _build(config: ModelConfig, group: RankGroup | None) -> torch.nn.Module:
    """The family's model at the shapes this process holds: whole, or one tensor-parallel rank's shard."""
    if group is None:
        return model_class(config)(config)
    model = model_class(config)(local_config(config, group.size))
    shard_model(model, config, group)
    return model


def load_model(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    group: RankGroup | None = None,
) -> tuple[QwenVLModel, ModelConfig]:
    """Build the model for config.json in `model_dir` and fill it from its safetensors files.

    Every parameter must be filled and every stored tensor must fill one (MissingTensorError,
    UnexpectedTensorError). A tied config follows transformers' tie_weights on what the files hold: lm_head absent
    -> tied; only lm_head stored -> it fills the embeddings; both stored -> tied if equal, untied otherwise.
    A tensor-parallel rank (`group`) builds its shard (parallel/plan.py) and reads only its slice of each
    sharded tensor from the mapped files.
    """
    config = load_config(model_dir)
    files = checkpoint_files(model_dir)
    stored = {hf_to_internal(name) for path in files for name in tensor_names(path)}
    both = config.tie_word_embeddings and LM_HEAD in stored and EMBED in stored
    built = replace(config, tie_word_embeddings=False) if both else config
    with torch.device("meta"):
        model = _build(built, group)  # no allocation, no random init
    materialize(model, dtype, device)
    for name in getattr(model, "float32_parameters", lambda: [])():  # transformers' _keep_in_fp32_modules_strict
        materialize(model.get_submodule(name), torch.float32, device)
    tensors = iter_safetensors(model_dir)
    if config.tie_word_embeddings and EMBED not in stored and LM_HEAD in stored:
        tensors = _renamed(tensors, LM_HEAD, "model.language_model.embed_tokens.weight")  # tie_weights' swap
    load_state_dict_into(model, tensors, strict=True, adopt=True)
    if both and group is None:  # a rank holds a slice of lm_head: kept untied (the same values either way)
        config = _settle_tie(model, config)
        model.config = config
    model.requires_grad_(False).eval()
    return model, config
