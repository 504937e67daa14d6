"""CXR-Phantom: phantom chest radiographs paired with real report text, with known classes and boxes.

Public API:
- ``generate(out, n, seed=0, source="both", size=256, dicom=False, workers=None, ...)`` writes a data set
  (MIMIC-CXR-JPG tree and CSVs, MS-CXR box CSV, ground-truth parquet); ``medclr phantom`` is its CLI.
- ``attach_ground_truth(manifest, phantom_dir)`` adds ``latent_class`` / ``latent_class_prob``.
- ``read_ground_truth(phantom_dir)``, ``false_negative_rates(prob, batch)``.
- ``load_material()``, ``plan_study(material, source, seed, k)``, ``render(material, spec, size)`` for one study.

Imports are lazy so ``import medclr.phantom`` stays light.
"""

from __future__ import annotations

_EXPORTS = {
    "generate": "medclr.phantom.dataset",
    "attach_ground_truth": "medclr.data.groundtruth",
    "read_ground_truth": "medclr.data.groundtruth",
    "false_negative_rates": "medclr.phantom.groundtruth",
    "load_material": "medclr.phantom.material",
    "plan_study": "medclr.phantom.plan",
    "class_model_prob": "medclr.phantom.plan",
    "render": "medclr.phantom.renderer",
    "latent_class": "medclr.phantom.vocab",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'medclr.phantom' has no attribute {name!r}")
