"""Orders and their invoices, and the nightly export of invoices to accounting."""
