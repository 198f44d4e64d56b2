"""matplotlib for the figure modules: the Agg backend (files, no display), and a clear error when
the optional `plot` extra is not installed."""


def pyplot():
    try:
        import matplotlib
    except ImportError as e:  # the `plot` extra
        raise ImportError("figures need matplotlib: pip install 'ssmgate[plot]' (make venv installs it)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
