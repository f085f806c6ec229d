"""The training API's tests; ``user_models.py`` here is the user's module (the
``user_path`` fixture, in ``tests/conftest.py``, makes it importable by child processes)."""
