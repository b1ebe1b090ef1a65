"""Generation engines behind the speech API (interface in ``base``)."""
