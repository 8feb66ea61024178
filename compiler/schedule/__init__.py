"""Schedule: takes a ComputeDAG and transform steps; gives the State (Ansor's steps replayed) and its loop IR, lowered
and simplified, with a numpy interpreter of the loop IR as its executable spec."""
