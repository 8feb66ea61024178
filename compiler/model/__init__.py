"""Model: takes an ONNX model (or a Graph built by hand); gives the optimized Graph (rewrites, layout, the passes in
one ordered list), its fused groups and the memory plan of the values between them."""
