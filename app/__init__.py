"""medclr app package."""
