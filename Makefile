# threeproxy: build, test and install. Cargo does the building; this file
# only names the steps and the install layout (3proxy's Makefile.Linux).
-include config.mak

PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
MANDIR     ?= $(PREFIX)/share/man
SYSCONFDIR ?= /etc
SYSTEMDDIR ?= /lib/systemd/system
INITDIR    ?= /etc/init.d
DESTDIR    ?=
CARGO      ?= cargo
BIN         = target/release/3proxy
# Other names of the one binary: the password tool and the standalone
# services, as 3proxy installs them.
LINKS       = 3proxy_crypt 3proxy_proxy 3proxy_socks 3proxy_pop3p 3proxy_smtpp 3proxy_imapp 3proxy_ftppr \
              3proxy_tcppm 3proxy_udppm 3proxy_tlspr

.PHONY: all test check lint fuzz asan soak install install-bin install-man install-etc install-init uninstall clean bench run

all: $(BIN)

# The binary looks for $(SYSCONFDIR)/3proxy/3proxy.cfg when run without a
# cfg and /usr/local/etc/3proxy/3proxy.cfg (3proxy's default) is absent.
$(BIN): FORCE
	THREEPROXY_SYSCONFDIR=$(SYSCONFDIR) $(CARGO) build --release --locked

FORCE:

# The whole test suite: unit and integration tests of the proxy, and the
# benchmark harness's own unit tests (the benchmark itself is `make bench`).
# Run last and one at a time: the tests that load the machine (the soak,
# 5,000 parked clients; beside them other tests' proxies were slow to
# start, and the soak's TIME_WAIT sockets slow every test that reads
# /proc/net/tcp for a minute after it), and the fault tests, which
# measure the proxy's CPU time and count descriptors to the last one
# (beside other tests a refusal came late and one was miscounted).
HEAVY = faults:: park::thousands_of_idle_tunnels_park_and_carry_on soak::soak_mixed_connections

test:
	sh tests/deps.sh
	$(CARGO) test --locked -- --test-threads=4 $(foreach t,$(HEAVY),--skip $(t))
	$(CARGO) test --locked --test integration -- --test-threads=1 $(HEAVY)
	python3 -m unittest discover -s bench/tests -t .

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

# Fuzz every parser for FUZZ_TIME seconds each (default 15: under four
# minutes for the fourteen targets; FUZZ_TIME=600 before a release). Needs nightly
# and cargo-fuzz (README, "Fuzzing"); FUZZ_TARGETS picks some.
FUZZ_TIME ?= 15
fuzz:
	FUZZ_TIME=$(FUZZ_TIME) sh fuzz/run.sh $(FUZZ_TARGETS)

# The unit tests (every parser's) and the corpus replay under
# AddressSanitizer (nightly), in a target directory of their own. Memory
# errors only: a few tests leak on purpose (mem::forget of a session).
# No fake stacks for use-after-return: sys::thread's test finds a thread's
# stack by the address of a local, which a fake stack would move to the heap.
ASAN = RUSTFLAGS=-Zsanitizer=address CARGO_TARGET_DIR=target/asan \
	ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0 \
	$(CARGO) +nightly test --locked --target x86_64-unknown-linux-gnu
asan:
	$(ASAN) --lib -- --test-threads=2
	$(ASAN) --test integration -- --test-threads=2 fuzz_corpus::

# The soak (tests/soak.rs) at full size, on a release build: SOAK_CONNECTIONS
# connections (default a million) from SOAK_WORKERS clients at once, mixed
# across the HTTP proxy, CONNECT, SOCKS5 and tcppm, with faults; then the
# proxy's threads, descriptors and memory must be back at their baseline.
# Loopback only; the access log takes about 100 MiB of the temp dir. The
# normal suite runs the same test with 30,000 connections.
SOAK_CONNECTIONS ?= 1000000
SOAK_WORKERS ?= 16
soak:
	SOAK_CONNECTIONS=$(SOAK_CONNECTIONS) SOAK_WORKERS=$(SOAK_WORKERS) \
		$(CARGO) test --release --locked --test integration -- \
		--exact soak::soak_mixed_connections --nocapture

# Start a proxy on the sample cfg (loopback only), in the foreground.
run: $(BIN)
	./$(BIN) cfg/3proxy.cfg

install: install-bin install-man install-etc install-init

install-bin: $(BIN)
	install -d $(DESTDIR)$(BINDIR)
	install -m 755 $(BIN) $(DESTDIR)$(BINDIR)/3proxy
	for n in $(LINKS); do ln -sf 3proxy $(DESTDIR)$(BINDIR)/$$n; done

install-man:
	install -d $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(MANDIR)/man5
	install -m 644 man/3proxy.8 $(DESTDIR)$(MANDIR)/man8/3proxy.8
	install -m 644 man/3proxy.cfg.5 $(DESTDIR)$(MANDIR)/man5/3proxy.cfg.5
	install -m 644 man/3proxy_crypt.8 $(DESTDIR)$(MANDIR)/man8/3proxy_crypt.8

# Never overwrite a cfg the administrator already has.
install-etc:
	install -d $(DESTDIR)$(SYSCONFDIR)/3proxy
	if [ ! -e $(DESTDIR)$(SYSCONFDIR)/3proxy/3proxy.cfg ]; then \
		install -m 644 cfg/3proxy.cfg $(DESTDIR)$(SYSCONFDIR)/3proxy/3proxy.cfg; \
	else \
		echo "keeping existing $(DESTDIR)$(SYSCONFDIR)/3proxy/3proxy.cfg"; \
	fi

install-init:
	install -d $(DESTDIR)$(SYSTEMDDIR) $(DESTDIR)$(INITDIR)
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		cfg/3proxy.service > $(DESTDIR)$(SYSTEMDDIR)/3proxy.service
	chmod 644 $(DESTDIR)$(SYSTEMDDIR)/3proxy.service
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		cfg/3proxy.init > $(DESTDIR)$(INITDIR)/3proxy
	chmod 755 $(DESTDIR)$(INITDIR)/3proxy

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/3proxy
	for n in $(LINKS); do rm -f $(DESTDIR)$(BINDIR)/$$n; done
	rm -f $(DESTDIR)$(MANDIR)/man8/3proxy.8 $(DESTDIR)$(MANDIR)/man5/3proxy.cfg.5
	rm -f $(DESTDIR)$(MANDIR)/man8/3proxy_crypt.8
	rm -f $(DESTDIR)$(SYSTEMDDIR)/3proxy.service $(DESTDIR)$(INITDIR)/3proxy
	@echo "left $(DESTDIR)$(SYSCONFDIR)/3proxy/3proxy.cfg in place"

# The benchmark: needs root and a quiet machine; see bench/README.md.
bench: $(BIN)
	python3 bench/bench.py $(BENCH_ARGS)

clean:
	$(CARGO) clean
