"""The measurement farm: Celery tasks that drive tuning jobs, measure candidate batches and compile artifacts."""
