//! 3proxy result codes (`%E` in the access log), as one type.
//!
//! Mirrors the "Log error codes reference" of 3proxy's documentation: codes
//! are grouped by range, and every service reports the outcome of a session
//! as one of them. The numbers are part of the user-visible interface (log
//! parsers and monitoring depend on them), so they never change.
//!
//! Every code has a name here, and [`ALL`] lists them with their meaning;
//! codes made by a rule (a base plus a number the peer or a parser gave)
//! have their base named and the rule in a `const fn`, and [`FAMILIES`]
//! lists the ranges they cover. The man page's RESULT CODES section lists
//! the same codes (a test checks both ways). Services share some numbers
//! with different meanings (611 for pop3p and smtpp, 701-703 for ftppr
//! and the admin page, 801, 821 and 822 for ftppr, auto and dnspr): each
//! service has its own name for them.

/// A session's result code. `Res::OK` (0) means a peer closed normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Res(pub u32);

/// Each entry: `/// meaning` then `NAME = number;`. Makes the constants
/// and [`ALL`] from one list, so the table cannot miss a constant.
macro_rules! codes {
    ($( $(#[doc = $doc:literal])+ $name:ident = $n:literal; )*) => {
        // Some codes are 3proxy's but never produced here (the table and
        // the man page list every one): they are named all the same.
        #[allow(dead_code)]
        impl Res {
            $( $(#[doc = $doc])+ pub const $name: Res = Res($n); )*
        }

        /// Every named code: the code, its name and its meaning.
        #[allow(dead_code)]
        pub const ALL: &[(Res, &str, &str)] = &[
            $( (Res::$name, stringify!($name), concat!($($doc),+)) ),*
        ];
    };
}

codes! {
    // 0: success.
    /// Session ended normally: one of the peers closed.
    OK = 0;

    // 1-10: authentication and access control.
    /// Refused by a `deny` entry of the ACL.
    ACL_DENY = 1;
    /// 3proxy-internal: a redirection is under way; never logged.
    REDIRECT = 2;
    /// Refused: no ACL entry matched (or `auth dnsname` found no name).
    ACL_NO_MATCH = 3;
    /// Refused: the auth type needs a user name and the request has none.
    AUTH_NO_USER = 4;
    /// Refused by `strong`: unknown user, or no password given; by `ldap`:
    /// the user is not in the `ldapaccess` group.
    AUTH_BAD_USER = 5;
    /// Refused by `strong`: wrong password for a clear-text (CL) user.
    AUTH_BAD_CL = 6;
    /// Refused by `strong`: wrong password for a crypt (CR) user; by
    /// `ldap`: a bind failed, or no LDAP server answered in time.
    AUTH_BAD_CR = 7;
    /// Refused by `strong`: wrong password for an NT-hash (NT) user.
    AUTH_BAD_NT = 8;
    /// 3proxy-internal: redirection data not found; never logged.
    REDIRECT_NO_DATA = 9;
    /// A limit was reached: connlim, a traffic quota, or authcache `limit`.
    QUOTA = 10;

    // 11-19: the outgoing connection.
    /// socket() failed for the outgoing connection.
    SOCKET = 11;
    /// bind() failed for the outgoing connection (bad `-e`, bind to device).
    BIND = 12;
    /// connect() failed or timed out.
    CONNECT = 13;
    /// getpeername() failed: the session's addresses are unknown.
    PEERNAME = 14;
    /// getsockname() failed (3proxy; not produced by this release).
    SOCKNAME = 15;
    /// A `pcre` filter refused a body after the response head had been
    /// sent: the connection is closed.
    FILTER = 19;

    // 20-29: common errors.
    /// Out of memory or no thread could be started.
    NOMEM = 21;
    /// `auth radius`: the server answered Access-Reject (3proxy logs 4,
    /// or the number a Reply-Message starts with, which we log too).
    RADIUS_REJECT = 25;
    /// `auth radius`: no `radius` server gave a valid answer in time, or
    /// there is no `radius` line (3proxy logs 4).
    RADIUS_NO_ANSWER = 26;
    /// The Session-Timeout an Access-Accept gave has run out: the session
    /// was ended (3proxy does not read Session-Timeout).
    RADIUS_SESSION_TIMEOUT = 27;

    // 30-79: parent proxies (30-39 CONNECT, 40-49 SOCKS4, 50-69 SOCKS5).
    /// A parent chain ended in a state it cannot use (3proxy: unknown parent type).
    PARENT_INTERNAL = 30;
    /// `connect` parent: the CONNECT request could not be sent.
    PARENT_CONNECT_SEND = 31;
    /// `connect` parent: no status line, or a malformed one.
    PARENT_CONNECT_REPLY = 32;
    /// `connect` parent: a status other than 2xx.
    PARENT_CONNECT_REFUSED = 33;
    /// `connect` parent: a malformed or too long reply header.
    PARENT_CONNECT_HEAD = 34;
    /// `ha` parent: the PROXY protocol line could not be sent.
    PARENT_HA_SEND = 39;
    /// `socks4` parent: the request could not be sent.
    PARENT_SOCKS4_SEND = 41;
    /// `socks4` parent: the reply was cut short.
    PARENT_SOCKS4_SHORT = 42;
    /// `socks4` parent: the request was refused.
    PARENT_SOCKS4_REFUSED = 43;
    /// `socks4` parent: the destination is not an IPv4 address.
    PARENT_SOCKS4_NOT_V4 = 44;
    /// `socks5` parent: a message could not be sent, or a name is too long.
    PARENT_SOCKS5_SEND = 51;
    /// `socks5` parent: no answer to the greeting.
    PARENT_SOCKS5_NO_GREETING = 52;
    /// `socks5` parent: an answer that is not SOCKS 5.
    PARENT_SOCKS5_NOT_V5 = 53;
    /// `socks5` parent: no method both sides accept.
    PARENT_SOCKS5_NO_METHOD = 54;
    /// `socks5` parent: no answer to the username and password.
    PARENT_SOCKS5_NO_AUTH_REPLY = 55;
    /// `socks5` parent: the username and password were refused.
    PARENT_SOCKS5_AUTH_REFUSED = 56;
    /// `socks5` parent: no reply to the request.
    PARENT_SOCKS5_NO_REPLY = 57;
    /// `socks5` parent: a reply with an unknown or unusable address type.
    PARENT_SOCKS5_BAD_ATYP = 58;
    /// `socks5` parent: a reply cut short.
    PARENT_SOCKS5_SHORT_REPLY = 59;
    /// `socks5` parent refused: 60 plus the last digit of its REP (see
    /// [`Res::parent_socks5_rep`]).
    PARENT_SOCKS5_REP = 60;
    /// UDP through parents that cannot carry it, or the parent ended the association.
    PARENT_NO_UDP = 70;

    // 80: threeproxy's own.
    /// The session was ended from outside: the admin page's "end" (or
    /// `live::end`), not by either peer.
    ENDED = 80;
    /// The service was at `maxconn` with a client waiting: this session,
    /// idle between two requests or slow to send its request head or
    /// handshake, was closed so that the new client got its slot
    /// (`reclaim`).
    RECLAIMED = 81;
    /// The request head or handshake came slower than `minrate` after
    /// its grace: the session was closed (an HTTP client gets a 408).
    TOO_SLOW = 82;

    // 90-99: the end of an established session (the relay).
    /// pipe() or splice() failed in the relay.
    SPLICE = 90;
    /// poll() failed in the relay.
    POLL = 91;
    /// Idle timeout: no data moved for the service's inactivity timeout.
    IDLE = 92;
    /// Too many rounds without progress (3proxy; not produced by this release).
    NO_PROGRESS = 93;
    /// The session closed with data that could not be delivered.
    UNSENT = 94;
    /// Read or write error on the client socket (in the relay, a write
    /// error: a reset while reading ends that side as its close does).
    CLIENT_ERR = 95;
    /// Read or write error on the server socket (in the relay, as for 95).
    SERVER_ERR = 96;
    /// Errors on both sockets.
    BOTH_ERR = 97;
    /// 3proxy-internal: the server byte budget was reached; never logged.
    SERVER_BUDGET = 98;
    /// 3proxy-internal: the client byte budget was reached; never logged.
    CLIENT_BUDGET = 99;

    // 100-101.
    /// Host not found, or no destination.
    NOHOST = 100;
    /// Local redirections went round too often (more than 15 hand-offs).
    REDIRECTION_LOOP = 101;

    // 300-399: tlspr (bases of the rules in `Res::tls`).
    /// tlspr: the client's first record is not a handshake; base of the
    /// client record errors (302-305).
    TLS_RECORD = 300;
    /// tlspr: the server's first record is not a handshake; base of the
    /// server record errors (342-345).
    TLS_SERVER_RECORD = 340;
    /// tlspr STARTTLS: the server's greeting is not its protocol's.
    STARTTLS_SERVER_GREETING = 361;
    /// tlspr STARTTLS: the exchange with the server failed (it closed, an
    /// error answer, a timeout).
    STARTTLS_SERVER_IO = 362;
    /// tlspr STARTTLS: the server does not offer STARTTLS, or refused it.
    STARTTLS_SERVER_REFUSED = 363;
    /// tlspr STARTTLS: the dialogue with the client failed before it asked
    /// for TLS.
    STARTTLS_CLIENT = 364;
    /// tlspr `-c3`: the server speaks TLS 1.3, whose certificate cannot be
    /// seen.
    TLS_CERT_HIDDEN = 370;
    /// tlspr `-c3`: a server handshake record could not be passed to the
    /// client.
    TLS_TO_CLIENT = 371;
    /// tlspr `-c3`: the server sent no certificate.
    TLS_NO_SERVER_CERT = 373;
    /// tlspr `-c4`: the server asked for no client certificate.
    TLS_NO_CERT_REQUEST = 374;
    /// tlspr `-c4`: the client sent no certificate, or its handshake could
    /// not be passed to the server.
    TLS_NO_CLIENT_CERT = 375;

    // 400-499: socks.
    /// socks: the first byte is not 4 or 5, or did not come; or the method could not be sent.
    SOCKS_VERSION = 401;
    /// socks: unknown command.
    SOCKS_COMMAND = 407;
    /// socks: a username/password exchange of a version other than 1, or none.
    SOCKS_AUTH_VERSION = 412;
    /// socks: a SOCKS 5 request that does not start with 5.
    SOCKS_REQUEST_VERSION = 421;
    /// socks: an empty host name, or a CONNECT to 0.0.0.0 or `::`.
    SOCKS_NULL_ADDR = 431;
    /// socks: a greeting or request cut short or malformed, or no acceptable method.
    SOCKS_SHORT = 441;
    /// socks: the password field cut short.
    SOCKS_SHORT_PASSWORD = 445;
    /// socks: the request's reserved byte did not come.
    SOCKS_SHORT_RSV = 447;
    /// socks: the user name or host name length did not come.
    SOCKS_SHORT_NAME = 451;
    /// socks BIND: no peer in time, or the client spoke or closed first.
    SOCKS_BIND_NO_PEER = 460;
    /// socks: CONNECT to port 0.
    SOCKS_PORT_ZERO = 461;
    /// socks BIND: the peer's connection could not be accepted.
    SOCKS_BIND_ACCEPT = 462;
    /// socks BIND: a peer from another address than the one requested.
    SOCKS_BIND_WRONG_PEER = 470;
    /// socks: the answer to username/password could not be sent.
    SOCKS_AUTH_REPLY = 481;
    /// socks UDP: a fragment, or a reserved field other than 0.
    SOCKS_UDP_FRAG = 483;
    /// socks UDP: a datagram header cut short.
    SOCKS_UDP_SHORT = 484;
    /// socks UDP: a host name in a datagram header cut short or not text.
    SOCKS_UDP_NAME = 485;

    // 500-599: proxy (HTTP); 511 also for a bad PROXY protocol line.
    /// HTTP: reading a request head failed midway.
    HTTP_NO_REQUEST_ERR = 507;
    /// HTTP: the client closed or went quiet before sending a request.
    HTTP_NO_REQUEST = 508;
    /// The client's first bytes were not a valid request: for `-H`, a
    /// missing or malformed PROXY protocol line (3proxy's 511, bad request).
    BAD_REQUEST = 511;
    /// HTTP: a malformed request line or header field (answered 400).
    HTTP_BAD_HEAD = 512;
    /// HTTP: an absolute URI with a scheme other than http:// (400).
    HTTP_SCHEME = 513;
    /// HTTP: ambiguous or invalid body length: Content-Length with
    /// Transfer-Encoding, differing lengths, an unknown coding (400).
    HTTP_FRAMING = 514;
    /// HTTP: no usable destination host or port (400).
    HTTP_BAD_TARGET = 515;
    /// HTTP: a head larger than the proxy accepts (431 for requests).
    HTTP_HEAD_TOO_LARGE = 516;
    /// HTTP: a `pcre` filter refused the request line, a head or a body
    /// (answered 503).
    FILTER_DENY = 517;
    /// The destination is the proxy's own listening address (loop).
    LOOP = 519;
    /// HTTP: sending the response to the client failed.
    HTTP_SEND_CLIENT = 521;
    /// HTTP: the server's answer was short or malformed (502).
    HTTP_BAD_REPLY = 522;
    /// HTTP: bad chunked coding from the server.
    HTTP_CHUNK_SERVER = 533;
    /// HTTP: bad chunked coding from the client (400).
    HTTP_CHUNK_CLIENT = 537;

    // 600-699: mail proxies.
    /// pop3p: the greeting could not be sent to the client.
    POP3_GREET_FAILED = 611;
    /// pop3p: no command line came.
    POP3_NO_COMMAND = 612;
    /// pop3p: the command is not USER.
    POP3_NOT_USER = 614;
    /// pop3p: the login has no server, an empty name, a bad port or an unknown host.
    POP3_BAD_LOGIN = 615;
    /// pop3p: the server sent no greeting.
    POP3_NO_BANNER = 621;
    /// pop3p: the server's greeting was not +OK, or was another proxy's.
    POP3_BAD_BANNER = 622;
    /// pop3p: USER could not be sent to the server, or got no answer.
    POP3_USER_FAILED = 623;
    /// smtpp: the greeting could not be sent to the client.
    SMTP_GREET_FAILED = 611;
    /// smtpp: no AUTH command came.
    SMTP_NO_AUTH = 662;
    /// smtpp: no name came after the AUTH LOGIN prompt.
    SMTP_NO_USERNAME = 663;
    /// smtpp: the name is empty, not base64, or a login without a server.
    SMTP_BAD_USERNAME = 664;
    /// smtpp: no password came.
    SMTP_NO_PASSWORD = 665;
    /// smtpp: the password is not base64.
    SMTP_BAD_PASSWORD = 666;
    /// smtpp: no response came after the AUTH PLAIN prompt.
    SMTP_NO_PLAIN = 667;
    /// smtpp: the AUTH PLAIN response is malformed.
    SMTP_BAD_PLAIN = 668;
    /// smtpp: the server sent no greeting.
    SMTP_NO_BANNER = 671;
    /// smtpp: the server's greeting was not 220 or was another proxy's, or EHLO got no answer.
    SMTP_BAD_BANNER = 672;
    /// smtpp: EHLO could not be sent to the server.
    SMTP_EHLO_FAILED = 673;
    /// smtpp: the server did not prompt for the name after AUTH LOGIN.
    SMTP_LOGIN_USER_REFUSED = 680;
    /// smtpp: the server did not prompt for the password after the name.
    SMTP_LOGIN_PASS_REFUSED = 681;
    /// smtpp: the server did not prompt after AUTH PLAIN.
    SMTP_PLAIN_REFUSED = 682;
    /// smtpp: the credentials are too long to send.
    SMTP_TOO_LONG = 683;
    /// imapp: the greeting could not be sent to the client.
    IMAP_GREET_FAILED = 691;
    /// imapp: no command line came, or it had no tag.
    IMAP_NO_COMMAND = 692;
    /// imapp: a malformed LOGIN or AUTHENTICATE.
    IMAP_BAD_LOGIN = 693;
    /// imapp: the login names no usable server.
    IMAP_BAD_DEST = 694;
    /// imapp: the server sent no greeting.
    IMAP_NO_GREETING = 695;
    /// imapp: the server's greeting was not OK, or was another proxy's.
    IMAP_BAD_GREETING = 696;
    /// imapp: asking the server for its capabilities failed.
    IMAP_CAPA_FAILED = 697;
    /// imapp: an AUTHENTICATE exchange with the client failed.
    IMAP_AUTH_FAILED = 698;
    /// imapp: logging in at the server failed.
    IMAP_LOGIN_FAILED = 699;

    // 700-799: FTP login at the server, and the admin page.
    /// ftppr: the server refused the name or password.
    FTP_LOGIN_REFUSED = 700;
    /// ftppr: no answer to PASS.
    FTP_PASS_NO_REPLY = 701;
    /// ftppr: the server's greeting was not 2xx.
    FTP_BAD_GREETING = 702;
    /// ftppr: USER could not be sent to the server.
    FTP_USER_SEND = 703;
    /// ftppr: no answer to USER.
    FTP_USER_NO_REPLY = 704;
    /// ftppr: PASS could not be sent to the server.
    FTP_PASS_SEND = 705;
    /// ftppr: the server sent no greeting.
    FTP_NO_GREETING = 706;
    /// proxy's ftp:// gateway: CWD could not be sent.
    FTP_CWD_SEND = 711;
    /// proxy's ftp:// gateway: no answer to CWD.
    FTP_CWD_NO_REPLY = 712;
    /// proxy's ftp:// gateway: the server refused TYPE I.
    FTP_TYPE_REFUSED = 740;
    /// proxy's ftp:// gateway: TYPE could not be sent.
    FTP_TYPE_SEND = 741;
    /// proxy's ftp:// gateway: no answer to TYPE.
    FTP_TYPE_NO_REPLY = 742;
    /// proxy's ftp:// gateway: the listing's final answer was not 1xx/2xx.
    FTP_BAD_FINAL_REPLY = 750;
    /// proxy's ftp:// gateway: no final answer after the listing.
    FTP_NO_FINAL_REPLY = 751;
    /// proxy's ftp:// gateway: no data connection, or RETR/LIST refused
    /// (answered 404).
    FTP_NO_DATA_CONN = 780;
    /// proxy's ftp:// gateway: sending to the client failed.
    FTP_CLIENT_SEND = 781;
    /// admin: the request could not be read or parsed.
    ADMIN_BAD_REQUEST = 701;
    /// admin: no such page.
    ADMIN_NOT_FOUND = 702;
    /// admin: rewriting the cfg (`/U`) is refused, showing it (`/F`) too
    /// (a file over 16 MiB), or ending sessions (`/E`) from another
    /// site's page.
    ADMIN_FORBIDDEN = 703;

    // 800-899: ftppr's session, auto, and dnspr.
    /// ftppr: the greeting could not be sent to the client.
    FTP_GREET_SEND = 801;
    /// auto: no byte came before the timeout, or the client closed first.
    AUTO_NO_BYTE = 801;
    /// ftppr: a command line shorter than four bytes.
    FTP_SHORT_COMMAND = 802;
    /// ftppr: a bad host in the login or OPEN, or one that does not resolve.
    FTP_BAD_HOST = 803;
    /// ftppr: a bad login.
    FTP_BAD_LOGIN = 804;
    /// ftppr: the answer to USER or PASS could not be sent to the client.
    FTP_LOGIN_TELL = 807;
    /// ftppr: `530 login` (a command before login) could not be sent.
    FTP_NOT_LOGGED_TELL = 810;
    /// ftppr: a command could not be sent to the server.
    FTP_COMMAND_SEND = 811;
    /// ftppr: the server's answer could not be sent to the client.
    FTP_ANSWER_TELL = 812;
    /// ftppr: no answer from the server to a command.
    FTP_NO_ANSWER = 813;
    /// ftppr: the data connection's socket could not be made.
    FTP_DATA_SOCKET = 821;
    /// ftppr: the data connection's socket could not be bound.
    FTP_DATA_BIND = 822;
    /// ftppr: the data listener's port is unknown.
    FTP_DATA_NAME = 824;
    /// ftppr: the answer to PASV, EPSV or PORT could not be sent.
    FTP_DATA_TELL = 825;
    /// ftppr: connecting to the client's PORT address failed.
    FTP_DATA_CONNECT = 826;
    /// ftppr: a malformed PORT.
    FTP_BAD_PORT = 828;
    /// ftppr: a data command without PASV, EPSV or PORT first.
    FTP_NO_DATA = 829;
    /// ftppr: `550 err` (the server's data side failed) could not be sent.
    FTP_DATA_REFUSED_TELL = 831;
    /// ftppr: `125 data` could not be sent.
    FTP_DATA_START_TELL = 832;
    /// ftppr: the server's transfer answer could not be sent to the client.
    FTP_TRANSFER_TELL = 833;
    /// ftppr: no answer from the server after a transfer.
    FTP_TRANSFER_NO_ANSWER = 834;
    /// ftppr: the client did not connect to the data port in time.
    FTP_DATA_TIMEOUT = 857;
    /// ftppr: accepting the client's data connection failed.
    FTP_DATA_ACCEPT = 858;
    /// ftppr: a `pcre` filter of type `request` refused the login
    /// (`name@host[:port]`, after PASS): the connection is closed.
    FTP_FILTER_LOGIN = 877;
    /// ftppr: a `cliheader` filter refused a PASV, EPSV or PORT command.
    FTP_FILTER_DATA_COMMAND = 878;
    /// ftppr: a `srvheader` filter refused the proxy's answer to PASV,
    /// EPSV or PORT.
    FTP_FILTER_DATA_ANSWER = 879;
    /// ftppr: a `cliheader` filter refused a transfer command (RETR,
    /// LIST, NLST, MLSD, STOR, APPE).
    FTP_FILTER_TRANSFER = 880;
    /// dnspr: a query too short or too long.
    DNS_SIZE = 814;
    /// dnspr: a query that is not exactly one question.
    DNS_QDCOUNT = 816;
    /// dnspr: a question running past the datagram.
    DNS_NAME = 817;
    /// dnspr: the socket towards the server could not be made.
    DNS_SOCKET = 818;
    /// dnspr: the service's own answer could not be sent to the client.
    DNS_SEND_LOCAL = 819;
    /// dnspr: the query could not be sent to the server.
    DNS_SEND_SERVER = 820;
    /// dnspr: no reply, or a bad one, from the server in time.
    DNS_NO_REPLY = 821;
    /// dnspr: the server's answer could not be sent on to the client.
    DNS_SEND_FORWARDED = 822;
    /// dnspr: the server could not be reached over TCP.
    DNS_CONNECT = 830;
    /// dnspr: a TCP reply cut short.
    DNS_TCP_SHORT = 832;
    /// dnspr: a TCP reply longer than the proxy takes.
    DNS_TCP_LONG = 833;
    /// dnspr: the name does not exist (the service answered NXDOMAIN).
    DNS_NXDOMAIN = 888;

    // 8000-8099: TLS with a parent, and with the client (`ssl_serv`).
    /// TLS: the handshake with a parent whose type ends in `s`, or with
    /// the destination itself (`ssl_cli`, modes 0-2), failed (its
    /// certificate refused under `ssl_client_verify`, a protocol
    /// error, a timeout); 3proxy's number for a failed handshake with the
    /// server.
    TLS_PARENT = 8011;
    /// TLS: `ssl_mitm`'s handshake with the client failed (after the one
    /// with the origin), or no certificate could be made for the name;
    /// 3proxy's number.
    TLS_MITM = 8012;
    /// TLS: the handshake with the client failed (a protocol error, no
    /// common version or cipher, the client closed); 3proxy's number.
    TLS_HANDSHAKE = 8013;
    /// TLS: the client sent something other than a TLS handshake (plain
    /// HTTP to a TLS port, say).
    TLS_NOT_TLS = 8014;
    /// TLS: the handshake did not finish within the STRING_SHORT timeout.
    TLS_TIMEOUT = 8015;
    /// TLS: the client's certificate was missing or not trusted
    /// (`ssl_server_verify`).
    TLS_CLIENT_CERT = 8016;

    // 997, 999.
    /// Address type not supported (SOCKS).
    NOTIMPL_ATYP = 997;
    /// Not implemented.
    NOTIMPL = 999;
}

/// Codes made by a rule, as ranges: (base, first, last, meaning). The
/// codes a peer or parser can give fall in `first..=last`; not every one
/// of them is reachable.
#[allow(dead_code)]
pub const FAMILIES: &[(Res, u32, u32, &str)] = &[
    (
        Res::PARENT_SOCKS5_REP,
        60,
        69,
        "socks5 parent refused: 60 plus the last digit of its REP",
    ),
    (
        Res::TLS_RECORD,
        302,
        305,
        "tlspr: the client's first record: 302 fewer than 5 bytes, 303 not TLS, \
         304 larger than the buffer, 305 cut short",
    ),
    (
        Res::TLS_CLIENT_HELLO,
        311,
        327,
        "tlspr: a malformed ClientHello (310 plus the parser's fault number)",
    ),
    (
        Res::TLS_SERVER_RECORD,
        342,
        345,
        "tlspr: the server's first record, faults as for 302-305",
    ),
    (
        Res::TLS_SERVER_HELLO,
        351,
        360,
        "tlspr: a malformed ServerHello (350 plus the parser's fault number)",
    ),
    (
        Res::TLS_SERVER_HELLO,
        366,
        367,
        "tlspr: a ServerHello with a bad ALPN (350 plus the parser's fault number)",
    ),
    (
        Res::TLS_SERVER_FLIGHT,
        382,
        385,
        "tlspr -c3: a later server record, faults as for 302-305",
    ),
    (
        Res::TLS_CLIENT_FLIGHT,
        392,
        395,
        "tlspr -c4: a later client record, faults as for 302-305",
    ),
];

impl Res {
    /// The first code of the parent proxy range (30-79).
    pub const PARENT_FIRST: Res = Res(30);
    /// The last code of the parent proxy range (30-79).
    pub const PARENT_LAST: Res = Res(79);
    /// tlspr: the base of a malformed ClientHello (311-327, see
    /// [`Res::tls`]); not a code itself.
    pub const TLS_CLIENT_HELLO: Res = Res(310);
    /// tlspr: the base of a malformed ServerHello (351-367); not a code
    /// itself.
    pub const TLS_SERVER_HELLO: Res = Res(350);
    /// tlspr `-c3`: the base of a later server record's faults (382-385).
    pub const TLS_SERVER_FLIGHT: Res = Res(380);
    /// tlspr `-c4`: the base of a later client record's faults (392-395).
    pub const TLS_CLIENT_FLIGHT: Res = Res(390);

    /// A `socks5` parent's refusal: [`Res::PARENT_SOCKS5_REP`] (60) plus
    /// the last decimal digit of its REP byte, as 3proxy reports it.
    pub const fn parent_socks5_rep(rep: u8) -> Res {
        Res(Res::PARENT_SOCKS5_REP.0 + (rep % 10) as u32)
    }

    /// A tlspr fault: `base` (one of the `TLS_*` codes) minus the parser's
    /// negative fault number `err` (-1 .. -17), so 310 and -4 give 314.
    pub const fn tls(base: Res, err: i32) -> Res {
        Res((base.0 as i32 - err) as u32)
    }

    /// A code of the parent proxy range, 30-79 (HTTP answers them 502).
    pub const fn is_parent(self) -> bool {
        self.0 >= Res::PARENT_FIRST.0 && self.0 <= Res::PARENT_LAST.0
    }

    /// The class of a code for the metrics' `code_class` label: a range
    /// of the RESULT CODES table, written as the table writes it.
    pub const fn class(self) -> usize {
        match self.0 {
            0 => 0,
            1..=10 => 1,
            11..=29 => 2,
            30..=79 => 3,
            80..=101 => 4,
            300..=399 => 5,
            400..=499 => 6,
            500..=599 => 7,
            600..=699 => 8,
            700..=799 => 9,
            800..=899 => 10,
            8000..=8099 => 11,
            _ => 12,
        }
    }

    /// A refusal by access control or authentication, 1-9 (not 10, a
    /// limit), or by `auth radius` (25, 26).
    pub const fn is_auth(self) -> bool {
        (self.0 >= Res::ACL_DENY.0 && self.0 < Res::QUOTA.0)
            || self.0 == Res::RADIUS_REJECT.0
            || self.0 == Res::RADIUS_NO_ANSWER.0
    }
}

/// The names of the classes [`Res::class`] gives, by class.
pub const CLASSES: [&str; 13] = [
    "0",
    "1-10",
    "11-29",
    "30-79",
    "80-101",
    "300-399",
    "400-499",
    "500-599",
    "600-699",
    "700-799",
    "800-899",
    "8000-8099",
    "other",
];

impl std::fmt::Display for Res {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:05}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn displays_as_five_digits() {
        assert_eq!(Res::IDLE.to_string(), "00092");
        assert_eq!(Res::LOOP.to_string(), "00519");
    }

    #[test]
    fn rules_give_3proxys_numbers() {
        assert_eq!(Res::parent_socks5_rep(1), Res(61));
        assert_eq!(Res::parent_socks5_rep(5), Res(65));
        assert_eq!(Res::parent_socks5_rep(10), Res(60));
        assert_eq!(Res::parent_socks5_rep(255), Res(65));
        assert_eq!(Res::tls(Res::TLS_RECORD, -2), Res(302));
        assert_eq!(Res::tls(Res::TLS_CLIENT_HELLO, -17), Res(327));
        assert_eq!(Res::tls(Res::TLS_SERVER_RECORD, -5), Res(345));
        assert_eq!(Res::tls(Res::TLS_SERVER_HELLO, -1), Res(351));
        assert!(Res(30).is_parent() && Res(79).is_parent());
        assert!(!Res(29).is_parent() && !Res(80).is_parent());
        assert_eq!(CLASSES[Res::OK.class()], "0");
        assert_eq!(CLASSES[Res::QUOTA.class()], "1-10");
        assert_eq!(CLASSES[Res::ENDED.class()], "80-101");
        assert_eq!(CLASSES[Res::NOHOST.class()], "80-101");
        assert_eq!(CLASSES[Res::TLS_CLIENT_CERT.class()], "8000-8099");
        assert_eq!(CLASSES[Res::NOTIMPL.class()], "other");
        for (code, _, _) in ALL {
            // Every named code falls in a class of the table.
            assert!(code.class() < CLASSES.len());
        }
        assert!(Res(1).is_auth() && Res(9).is_auth());
        assert!(!Res::OK.is_auth() && !Res::QUOTA.is_auth());
        assert!(Res::RADIUS_REJECT.is_auth() && Res::RADIUS_NO_ANSWER.is_auth());
        assert!(!Res::RADIUS_SESSION_TIMEOUT.is_auth());
    }

    #[test]
    fn table_names_are_unique_and_documented() {
        let mut names = BTreeSet::new();
        for (code, name, doc) in ALL {
            assert!(names.insert(*name), "{name} twice");
            assert!(!doc.trim().is_empty(), "{name} has no meaning");
            // 3proxy's TLS codes are 8011-8016; the rest are below 1000.
            assert!(
                code.0 < 1000 || (8000..8100).contains(&code.0),
                "{name}: {code}"
            );
        }
        for (base, first, last, _) in FAMILIES {
            assert!(first <= last && base.0 <= *first, "{base}");
        }
    }

    /// The codes a roff tag such as `.B 401`, `.BR 441 ", " 445` or
    /// `.BR 31 \(en 34` names; None for a tag that is not codes.
    fn tag_codes(tag: &str) -> Option<Vec<u32>> {
        let rest = tag
            .strip_prefix(".BR ")
            .or_else(|| tag.strip_prefix(".B "))?;
        let rest = rest.replace("\\(en", " - ").replace(['"', ','], " ");
        let mut out = Vec::new();
        let mut range = false;
        for t in rest.split_whitespace() {
            if t == "-" && !out.is_empty() && !range {
                range = true;
                continue;
            }
            let n: u32 = t.parse().ok()?;
            if range {
                let from = *out.last()?;
                if n <= from {
                    return None;
                }
                out.extend(from + 1..=n);
                range = false;
            } else {
                out.push(n);
            }
        }
        (!out.is_empty() && !range).then_some(out)
    }

    /// The man page's codes: those of the RESULT CODES section, and those
    /// of the per-service tables (an indented `.RS` list of tags after a
    /// paragraph that speaks of result codes), each with the line read.
    fn man_codes(man: &str) -> (BTreeSet<u32>, Vec<(usize, u32)>) {
        let lines: Vec<&str> = man.lines().collect();
        let (mut section, mut tables) = (BTreeSet::new(), Vec::new());
        let (mut in_section, mut in_table) = (false, false);
        let mut para = String::new();
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with(".SH") {
                in_section = *l == ".SH RESULT CODES";
            }
            if [".PP", ".IP", ".TP", ".SH", ".SS"]
                .iter()
                .any(|m| l.starts_with(m))
            {
                para.clear();
            } else if *l == ".RS" {
                in_table = !in_section && para.to_lowercase().contains("result codes");
            } else if *l == ".RE" {
                in_table = false;
            } else {
                para.push_str(l);
                para.push(' ');
            }
            if !(l.starts_with(".TP") && (in_section || in_table)) {
                continue;
            }
            let tag = lines.get(i + 1).copied().unwrap_or("");
            let codes = tag_codes(tag)
                .unwrap_or_else(|| panic!("man line {}: {tag:?} is not a result code", i + 2));
            for c in codes {
                if in_section {
                    section.insert(c);
                } else {
                    tables.push((i + 2, c));
                }
            }
        }
        (section, tables)
    }

    #[test]
    fn tag_parsing() {
        assert_eq!(tag_codes(".B 401"), Some(vec![401]));
        assert_eq!(tag_codes(".BR 98 \", \" 99"), Some(vec![98, 99]));
        assert_eq!(tag_codes(".BR 31 \\(en 34"), Some(vec![31, 32, 33, 34]));
        assert_eq!(tag_codes(".B socks"), None);
        assert_eq!(tag_codes(".BR 34 \\(en 31"), None);
        assert_eq!(tag_codes(".I 4"), None);
    }

    /// The man page and this table list the same codes.
    #[test]
    fn man_page_lists_every_code_and_only_those() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/man/3proxy.cfg.5");
        let man = std::fs::read_to_string(path).expect("man/3proxy.cfg.5");
        let mut known: BTreeSet<u32> = ALL.iter().map(|(c, _, _)| c.0).collect();
        for (_, first, last, _) in FAMILIES {
            known.extend(*first..=*last);
        }
        let (section, tables) = man_codes(&man);
        let missing: Vec<_> = known.difference(&section).collect();
        let unknown: Vec<_> = section.difference(&known).collect();
        assert!(missing.is_empty(), "codes not in RESULT CODES: {missing:?}");
        assert!(
            unknown.is_empty(),
            "RESULT CODES lists codes res.rs lacks: {unknown:?}"
        );
        // The socks and parent tables, at least.
        assert!(tables.len() > 20, "service tables not found: {tables:?}");
        for (line, c) in tables {
            assert!(
                known.contains(&c),
                "man line {line}: code {c} is not in res.rs"
            );
        }
    }
}
