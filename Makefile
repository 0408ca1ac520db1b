.PHONY: setup app test test-fast
setup:
	bash scripts/setup.sh
app:
	bash scripts/app.sh
test:
	bash scripts/test.sh
# The fast lane: the suite without the tests marked slow (long real-model, dashboard and subprocess runs).
test-fast:
	bash scripts/test.sh -m "not slow"
