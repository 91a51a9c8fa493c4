"""Private helpers of quantweave. Nothing here is public API."""
