"""medclr training package."""
