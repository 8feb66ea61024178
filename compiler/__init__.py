"""tilefarm's compiler, one folder per stage in the order data flows:

base      dtypes, typed errors, the Target record
model     ONNX -> Graph; graph rewrites, layout, the ordered optimizer, fusion into groups, memory planning
tensor    fused groups -> Tasks: tensor expressions, op definitions, ComputeDAGs keyed by workload
schedule  ComputeDAG -> State (Ansor's steps) -> loop IR: lowering, simplifier, interpreter
costs     what a program costs: features, the XGBoost cost model, measurement protocols, tuning records
targets   one folder per hardware kind behind the Backend protocol: search space, codegen, builder and runner
search    the tuner: evolutionary search per task and the task scheduler over a model's tasks
artifact  Graph + records -> one .tar: best State per task, lowered, linked with an AOT entry; its loader

Imports go only from a later stage to an earlier one (pyproject.toml [tool.importlinter]).
"""
