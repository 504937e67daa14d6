"""`medclr export --format hf`: a folder that plain tools read.

* ``text/``: the text backbone (``save_pretrained``) and its tokenizer: ``transformers.AutoModel`` /
  ``AutoTokenizer.from_pretrained(DIR / "text")`` load them (``add_pooling_layer=False`` for BERT: medclr's model
  has no pooler, so transformers would add a random one);
* ``image_encoder.safetensors``: the image tower's state dict (``trunk.*`` is torchvision's ResNet key for key,
  minus ``fc``; ``proj.*`` the 1x1 projection; ``neck.*`` BioViL-T's neck when it has one);
* ``text_projection.safetensors``: the projection from the pooled token to the joint space;
* ``head.safetensors``: the similarity head (empty for the cosine head);
* ``config.json``: how the pieces fit (architecture, preprocessing, the prompts, tau, the findings record);
* ``README.md``: the model card (``medclr.export.card``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from medclr.export.card import model_card
from medclr.export.describe import FORMAT, common, preprocessing, text_input
from medclr.files import write_text
from medclr.hub import quiet_transformers
from medclr.inference import Inference

TEXT_DIR = "text"
IMAGE_FILE = "image_encoder.safetensors"
PROJECTION_FILE = "text_projection.safetensors"
HEAD_FILE = "head.safetensors"


def _save_state(module: nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    # contiguous copies: safetensors refuses views, and a channels-last trunk holds strided tensors
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}, str(path),
              metadata={"format": "pt"})


def write(inference: Inference, folder: Path, metrics: dict[str, Any] | None) -> dict[str, Any]:
    model = inference.model
    with quiet_transformers():
        model.text_encoder.backbone.save_pretrained(folder / TEXT_DIR)
        model.tokenizer.save_pretrained(folder / TEXT_DIR)
    _save_state(model.image_encoder, folder / IMAGE_FILE)
    _save_state(model.text_encoder.proj, folder / PROJECTION_FILE)
    _save_state(model.head, folder / HEAD_FILE)
    files = {
        f"{TEXT_DIR}/": "text backbone and tokenizer (transformers AutoModel, AutoTokenizer)",
        IMAGE_FILE: "image tower: trunk.* (torchvision ResNet keys), proj.* (projection to the joint space)",
        PROJECTION_FILE: f"text projection ({model.text_encoder.projection_kind}) of the pooled token",
        HEAD_FILE: f"similarity head ({model.head.kind})",
        "config.json": "architecture, preprocessing, prompts, tau, findings record",
    }
    image_cfg = model.image_encoder.to_config()
    config = {
        "format": FORMAT, "kind": "hf", "architecture": "medclr.DualEncoder",
        "image": {**image_cfg, "weights": IMAGE_FILE, "output": "regions = proj(trunk(x)): B x D x h x w; global "
                  "embedding = L2-normalised spatial mean of the regions"},
        "text": {**text_input(inference, TEXT_DIR), "folder": TEXT_DIR, "projection_weights": PROJECTION_FILE,
                 "output": "embedding = L2-normalised projection of the pooled last hidden state"},
        "head_weights": HEAD_FILE,
        "preprocessing": preprocessing(inference, normalised_in_graph=False),
        **common(inference),
        "evaluation": {**metrics["_source"], "summary": metrics["summary"]} if metrics else None,
    }
    write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")
    write_text(folder / "README.md", model_card(inference, metrics, files))
    return config
