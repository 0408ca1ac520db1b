.PHONY: setup app test
setup:
	bash scripts/setup.sh
app:
	bash scripts/app.sh
test:
	bash scripts/test.sh
