"""A checkpoint's weights: checked against the config before anything is allocated, then loaded."""
from __future__ import annotations

import re

_LAYER = re.compile(r"blk\.(\d+)\.")


def check_shapes(tensors: dict, shapes: dict[str, tuple], num_layers: int, sizes: str) -> None:
    """Every weight named in shapes (name -> torch-order shape) against its shape, and no layers
    beyond num_layers: a wrong head count or size was a reshape error in the first forward, and a
    layer count below the file's silently ran a truncated model. A bias on a weight the model
    reads without one (Llama's attention_bias o_proj, mlp_bias) is refused: it was silently
    dropped. sizes: the config's numbers, for
    the message."""
    for name, want in shapes.items():   # in model order, whatever the file's
        t = tensors.get(name)
        if t is not None and tuple(t.shape) != want:
            raise ValueError(f"model: weight {name!r} has shape {tuple(t.shape)}, but the config needs {want} "
                             f"({sizes})")
    for name in tensors:
        if name.endswith(".bias") and name not in shapes and name[:-len("bias")] + "weight" in shapes:
            raise ValueError(f"model: weight {name!r} is a bias this architecture's model does not apply "
                             "(it would run without it)")
        m = _LAYER.match(name)
        if m and int(m.group(1)) >= num_layers:
            raise ValueError(f"model: weight {name!r} belongs to layer {m.group(1)}, but the config has "
                             f"{num_layers} layers")


def weight_loader(tensors: dict, load):
    """w(name, required=True) -> load(name, tensors[name]); None for an absent weight that is not
    required, a ValueError naming one that is."""
    def w(name, required=True):
        t = tensors.get(name)
        if t is None:
            if required:
                raise ValueError(f"model: weight {name!r} is missing from the checkpoint")
            return None
        return load(name, t)
    return w
