"""medclr evaluation package."""
