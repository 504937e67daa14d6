"""Size guards shared by every image reader (decompression bombs, absurd headers)."""

from __future__ import annotations

from medclr.errors import ImageReadError

# A large detector is ~4300x3500 (15 Mpx); 50 Mpx leaves room and stops bombs.
MAX_PIXELS = 50_000_000
MAX_SIDE = 16_384


def check_size(path, height: int, width: int, max_pixels: int = MAX_PIXELS) -> None:
    if height <= 0 or width <= 0:
        raise ImageReadError(f"{path}: image has no pixels ({height}x{width})")
    if height > MAX_SIDE or width > MAX_SIDE or height * width > max_pixels:
        raise ImageReadError(
            f"{path}: image is {width}x{height} pixels, over the limit of {max_pixels:,} pixels "
            f"(side <= {MAX_SIDE}); downsample it first"
        )
