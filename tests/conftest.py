from hypothesis import settings

# Same examples on every run: CI failures must reproduce.
settings.register_profile("loadkit", derandomize=True, deadline=None)
settings.load_profile("loadkit")
