"""Products and their stock: the five-minute reconciliation and the warehouse alert feed."""
