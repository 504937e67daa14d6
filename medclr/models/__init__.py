"""Image encoder (regions + global), text encoder, similarity heads and the DualEncoder wrapper.

See docs/models.md for the architecture, geometry and offline-loading rules.
"""

from medclr.hub import resolve_model_dir
from medclr.models.dual import DualEncoder, build_dual_encoder
from medclr.models.image import ImageEncoder, ImageFeatures, cached_imagenet_weights, grid_size
from medclr.models.similarity import CosineHead, LSENLHead, NonLocalBlock, build_head, lse_pool
from medclr.models.text import CXRBertProjectionHead, TextEncoder, TextFeatures

__all__ = [
    "CXRBertProjectionHead",
    "CosineHead",
    "DualEncoder",
    "ImageEncoder",
    "ImageFeatures",
    "LSENLHead",
    "NonLocalBlock",
    "TextEncoder",
    "TextFeatures",
    "build_dual_encoder",
    "build_head",
    "cached_imagenet_weights",
    "grid_size",
    "lse_pool",
    "resolve_model_dir",
]
