"""Search: takes a model's Tasks, a target's Backend and a records Database; gives tuning records: evolutionary
search per task guided by the cost model, and the task scheduler that shares the trials among tasks."""
