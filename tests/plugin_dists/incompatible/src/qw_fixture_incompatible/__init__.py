"""Test fixture package."""
