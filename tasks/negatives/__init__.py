"""Hard negatives: mining strategies (mining.py) and their stage family (stages.py)."""
