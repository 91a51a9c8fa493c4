"""Test helpers for quantweave users and plugin authors: reference models and quantizer."""
