"""Every contrastive loss of medclr, one module each, behind one registry.

    from medclr.losses import build_loss
    loss_fn = build_loss("nuclr", num_samples=len(dataset), tau=0.01)
    loss = loss_fn(image_emb, text_emb, index=batch_index)        # eta=... for dcl_lm

| name       | class         | needs            | paper / note                                  |
|------------|---------------|------------------|-----------------------------------------------|
| infonce    | InfoNCELoss   |                  | symmetric CLIP loss                           |
| siglip     | SigLIPLoss    |                  | sigmoid loss, learnable (or fixed) t and b    |
| dcl        | DCLLoss       |                  | Chuang et al., constant eta                   |
| dcl_lm     | DCLLMLoss     | eta (b,)         | sample-specific debiasing, eta from an LM     |
| sogclr     | SogCLRLoss    | index, num_samples | NUCLR with zeta = xi = 0                    |
| nuclr      | NUCLRLoss     | index, num_samples | per-sample u and popularity zeta            |
| decl       | DeCLLoss      | index if num_samples | Gamma auxiliaries, stochastic EM          |
| t_infonce  | TInfoNCELoss  | (weight)         | Student-t kernel InfoNCE (t-SimCLR)           |

The exact formulas, numerics and distributed scheme are in docs/losses.md.
"""

from __future__ import annotations

from medclr.errors import MedclrError
from medclr.losses import functional
from medclr.losses.base import ContrastiveLoss
from medclr.losses.dcl import DCLLMLoss, DCLLoss
from medclr.losses.decl import DeCLLoss
from medclr.losses.infonce import InfoNCELoss
from medclr.losses.nuclr import NUCLRLoss, SogCLRLoss
from medclr.losses.siglip import SigLIPLoss
from medclr.losses.t_infonce import TInfoNCELoss

LOSSES: dict[str, type[ContrastiveLoss]] = {
    "infonce": InfoNCELoss,
    "siglip": SigLIPLoss,
    "dcl": DCLLoss,
    "dcl_lm": DCLLMLoss,
    "sogclr": SogCLRLoss,
    "nuclr": NUCLRLoss,
    "decl": DeCLLoss,
    "t_infonce": TInfoNCELoss,
}


def build_loss(name: str, **kwargs) -> ContrastiveLoss:
    """Instantiate the loss registered under `name` with its constructor keyword arguments."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in LOSSES:
        raise MedclrError(f"loss: unknown name {name!r}; expected one of: {', '.join(LOSSES)}")
    try:
        return LOSSES[key](**kwargs)
    except TypeError as exc:  # a misspelt or missing keyword: one clear line, not a traceback
        raise MedclrError(f"loss {key!r}: bad arguments ({exc})") from None


__all__ = [
    "LOSSES", "build_loss", "functional", "ContrastiveLoss", "InfoNCELoss", "SigLIPLoss", "DCLLoss",
    "DCLLMLoss", "SogCLRLoss", "NUCLRLoss", "DeCLLoss", "TInfoNCELoss",
]
