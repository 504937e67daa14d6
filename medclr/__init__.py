"""medclr: chest X-ray vision-language pretraining with false-negative-aware contrastive losses."""

__version__ = "0.1.0"
