"""The end-to-end demo (``python -m demo``): one study document through all five AI jobs."""
