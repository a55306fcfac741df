#!/bin/sh
# Installs what the test suite needs and a fresh machine may lack: curl
# (HTTP and SOCKS clients), iproute2 (network namespace tests), python3
# (small helper processes inside namespaces, the bench harness's unit
# tests), openssl (a TLS origin for CONNECT tests), iptables (REDIRECT
# rules for the transparent plugin tests), python3-pyftpdlib (an FTP
# server for the ftp:// gateway), dnsmasq-base (a DNS server), dovecot and
# python3-aiosmtpd (mail servers with STARTTLS), prometheus (scrapes the
# admin service's /metrics), chromium (opens the admin service's sessions
# page; driven by tests/cdp_sessions.js with Node.js 20 or later, which the
# machine has), libsqliteodbc and unixodbc (SQLite's ODBC driver for the
# `log &DSN` tests), freeradius and freeradius-utils (a RADIUS server for
# auth radius and log radius), nginx (the HTTPS origin of the ssl_mitm
# tests), strace (sees that `-s` moved the data with splice(2)), vsftpd (an
# implicit FTPS server for ftppr's ssl_cli), slapd and ldap-utils (an LDAP
# server and ldapadd for auth ldap). Fails
# loudly (non-zero) rather than letting tests skip.
set -e
need=""
command -v curl >/dev/null 2>&1 || need="$need curl"
command -v ip >/dev/null 2>&1 || need="$need iproute2"
command -v python3 >/dev/null 2>&1 || need="$need python3"
command -v openssl >/dev/null 2>&1 || need="$need openssl"
command -v iptables >/dev/null 2>&1 || need="$need iptables"
command -v prometheus >/dev/null 2>&1 || need="$need prometheus"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
# An FTP server for the HTTP proxy's ftp:// gateway tests, for Debian's
# python3 (the tests run /usr/bin/python3, not a python3 first in PATH).
/usr/bin/python3 -c 'import pyftpdlib' >/dev/null 2>&1 || need="$need python3-pyftpdlib"
# Mail servers for the STARTTLS tests: Dovecot (IMAP, POP3), aiosmtpd.
[ -x /usr/sbin/dovecot ] || need="$need dovecot-imapd dovecot-pop3d"
/usr/bin/python3 -c 'import aiosmtpd' >/dev/null 2>&1 || need="$need python3-aiosmtpd"
# An implicit FTPS server (TLS from the first byte) for ftppr with ssl_cli.
[ -x /usr/sbin/vsftpd ] || need="$need vsftpd"
# A DNS server for the DNS-through-a-SOCKS-parent tests.
command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] || need="$need dnsmasq-base"
# The ODBC log tests: unixODBC's tools and SQLite's ODBC driver (the
# proxy carries its own driver manager; the driver loads libodbcinst).
# python3's sqlite3 module makes and reads the databases.
[ -e /usr/lib/x86_64-linux-gnu/odbc/libsqlite3odbc.so ] || need="$need libsqliteodbc"
command -v odbcinst >/dev/null 2>&1 || need="$need unixodbc"
/usr/bin/python3 -c 'import sqlite3' >/dev/null 2>&1 || need="$need libpython3-stdlib"
# A RADIUS server for `auth radius` and `log radius`, with radclient.
command -v freeradius >/dev/null 2>&1 || need="$need freeradius"
command -v radclient >/dev/null 2>&1 || need="$need freeradius-utils"
# An LDAP server for LdapPlugin's `auth ldap` (slapd, run in the
# foreground with a slapd.conf of the test's own) and ldapadd to load it.
[ -x /usr/sbin/slapd ] || need="$need slapd"
command -v ldapadd >/dev/null 2>&1 || need="$need ldap-utils"
# A TLS origin (HTTP over TLS) for the ssl_mitm tests: nginx.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need="$need nginx"
# The `-s` tests trace the proxy's splice(2) calls: strace.
command -v strace >/dev/null 2>&1 || need="$need strace"
if [ -n "$need" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "tests/deps.sh: missing:$need (run as root to install them)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
fi
