"""Unit tests: one module per module of batchgen/ and expectations/, in folders that mirror them."""
