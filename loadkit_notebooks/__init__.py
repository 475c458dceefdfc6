"""The notebook layer, on top of the library: ``scenario`` (old/new records), ``viz`` (plotly
figures and the toggle) and ``stories`` (one module per notebook). The library never imports it.
"""
