"""Lets PyPI's torchvision import beside a CPU torch: defines the two op schemas it registers unguarded.

Copied by scripts/sglang-cli-env into the SGLang 0.5.10-0.5.15 venvs as tunedash_torchvision_ops.py and
loaded at interpreter start by a .pth file; it imports nothing heavy until `torchvision` is looked up.
PyPI's x86_64 torchvision is a CUDA build whose C++ ops cannot load beside torch 2.13.0+cpu. torchvision
then runs without its ops (extension._has_ops() is False), except that _meta_registrations.py registers
fake kernels for torchvision::nms and torchvision::qnms unconditionally, which fails with "operator
torchvision::nms does not exist". Defining those two schemas (no kernels) before torchvision's first import
is all this does: calling nms still fails, as any op of a torchvision without its C++ ops does.
"""

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

_SCHEMAS = {
    "torchvision::nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "torchvision::qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


class DefineTorchvisionOpSchemas(importlib.abc.MetaPathFinder):
    """A finder that finds nothing: on the first lookup of `torchvision` it defines the schemas, then leaves."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch  # type: ignore[import-not-found]  # (only in the SGLang venvs)

        for qualname, schema in _SCHEMAS.items():
            torch.library.define(qualname, schema)
        return None


sys.meta_path.insert(0, DefineTorchvisionOpSchemas())
