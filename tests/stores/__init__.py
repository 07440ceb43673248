"""Store tests: the contract on every store we ship (test_contract.py), then each store's own."""
