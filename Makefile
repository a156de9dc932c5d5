# The two commands of the README:
#   make demo   runs the demo: worker processes contending for a lock on a Redis it starts
#   make test   runs the whole test suite
# Both install redis-server, redis-tools and redis-sentinel when missing.

GO ?= go
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)

.PHONY: demo test redis lint bench fuzz reliability

demo: redis
	$(GO) run ./examples/cli-demo

# Each fuzz target runs for a count of inputs, a few seconds' worth: a
# count, unlike a duration, cannot end in the fuzzing engine's spurious
# "context deadline exceeded" at the deadline (fixed in Go 1.27).
FUZZ_TARGETS := FuzzKeys=30000x FuzzGlob=20000x FuzzOptions=40000x FuzzRetry=40000x FuzzModel=400x
CLI_FUZZ_TARGETS := FuzzParseTarget=30000x FuzzRunFlags=10000x FuzzURLPassword=20000x

# Modules of their own, so that their dependencies stay out of the core's.
NESTED := rueidis redigo bench reliability otel

test: redis lint
	$(GO) test -race -count=1 -timeout 15m ./...
	@for m in $(NESTED); do echo "== $$m"; (cd $$m && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...) || exit 1; done
	@for f in $(FUZZ_TARGETS); do $(GO) test -run '^$$' -fuzz "^$${f%=*}$$" -fuzztime "$${f#*=}" . || exit 1; done
	@for f in $(CLI_FUZZ_TARGETS); do $(GO) test -run '^$$' -fuzz "^$${f%=*}$$" -fuzztime "$${f#*=}" ./cmd/dlock || exit 1; done

# bench compares dlock with its peers side by side (about 4 minutes);
# it rewrites bench/results/latest.md and latest.svg.
bench: redis
	cd bench && $(GO) run ./cmd/dlockbench

# reliability runs the fault suite (about six minutes) and rewrites
# docs/reliability.md.
reliability: redis
	cd reliability && $(GO) run ./cmd/dlockfault -out ../docs/reliability.md

lint:
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# redis installs the Redis server, client and sentinel from the system
# package manager when any of them is missing.
redis:
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null || ! command -v redis-sentinel >/dev/null; then \
	  echo "installing redis-server redis-tools redis-sentinel"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools redis-sentinel >/dev/null; \
	fi
	@redis-server --version
