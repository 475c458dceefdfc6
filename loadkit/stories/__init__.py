"""Scenario functions behind the notebooks, one module per topic, where tests can reach them."""
