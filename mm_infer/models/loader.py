"""Load HF safetensors checkpoints (legacy and new tensor names) into QwenVLModel; in-place refits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from mm_infer.models.config import ModelConfig, load_config
from mm_infer.models.errors import MissingTensorError, ShapeMismatchError, UnexpectedTensorError
from mm_infer.models.qwen2_vl import QwenVLModel

PATCH_EMBED = "visual.patch_embed.weight"


def hf_to_internal(name: str) -> str | None:
    """Map an HF tensor name (either layout) to our parameter name; None for tensors we drop."""
    if name.startswith("model.visual."):
        name = name[len("model.") :]
    elif name.startswith("model.language_model."):
        name = "language." + name[len("model.language_model.") :]
    elif name.startswith("model."):
        name = "language." + name[len("model.") :]
    if name == "visual.patch_embed.proj.weight":
        return PATCH_EMBED
    if name.endswith("rotary_emb.inv_freq") or name.endswith("rotary_pos_emb.inv_freq"):
        return None
    return name


def load_state_dict_into(
    model: QwenVLModel, named_tensors: Iterable[tuple[str, Tensor]] | Mapping[str, Tensor], *, strict: bool = False
) -> set[str]:
    """Copy HF-named tensors into model parameters in place (dtype/device converted); returns names filled.

    strict=True additionally requires every parameter to be filled. Unknown names always raise, except
    lm_head.weight on a tied model (some tied checkpoints still store it).
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    params = dict(model.named_parameters())
    filled: set[str] = set()
    with torch.no_grad():
        for hf_name, tensor in items:
            name = hf_to_internal(hf_name)
            if name is None or (name == "lm_head.weight" and model.lm_head is None):
                continue
            if name not in params:
                raise UnexpectedTensorError(f"checkpoint tensor {hf_name!r} maps to no parameter ({name!r})")
            param = params[name]
            if name == PATCH_EMBED:
                tensor = tensor.reshape(tensor.shape[0], -1)  # Conv3d [D, C, T, ph, pw] -> [D, C*T*ph*pw]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ShapeMismatchError(
                    f"tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
                )
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
            filled.add(name)
    if strict and (missing := sorted(set(params) - filled)):
        raise MissingTensorError(f"checkpoint lacks tensors for {len(missing)} parameters, e.g. {missing[:5]}")
    return filled


def iter_safetensors(model_dir: str | Path) -> Iterable[tuple[str, Tensor]]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MissingTensorError(f"no *.safetensors files in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def materialize(model: torch.nn.Module, dtype: torch.dtype, device: str | torch.device) -> None:
    """Give every (meta) parameter uninitialised storage; avoids to_empty, whose meta path imports sympy."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=dtype, device=device), requires_grad=False
                )


def load_model(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[QwenVLModel, ModelConfig]:
    """Build the model for config.json in `model_dir` and fill it from its safetensors files."""
    config = load_config(model_dir)
    with torch.device("meta"):
        model = QwenVLModel(config)  # no allocation, no random init
    materialize(model, dtype, device)
    load_state_dict_into(model, iter_safetensors(model_dir), strict=True)
    model.requires_grad_(False).eval()
    return model, config
