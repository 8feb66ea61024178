"""Model: takes an ONNX model (or a Graph built by hand); gives the optimized Graph (rewrites, layout, the passes in
one ordered list), its fused groups and the memory plan of the values between them."""


def __getattr__(name: str):
    # load_any (frontends.py) on first use: importing it loads the ONNX frontend, which most of the stage never needs
    if name == "load_any":
        from compiler.model.frontends import load_any

        return load_any
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
