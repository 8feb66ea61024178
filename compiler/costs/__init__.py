"""Costs: takes programs (States) and their measurements; gives program features, the XGBoost cost model, the
Builder/Runner measurement protocols, and tuning records with the Database protocol."""
