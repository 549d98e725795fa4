"""A model-based test of the queue's public calls (``tests/test_model.py`` runs it)."""
