//! The access log's targets (3proxy's log.c `dolog`, `logstdout`,
//! `logfile`): where finished sessions are written.
//!
//! Invariants: a record is formatted into one buffer and written with one
//! call, so lines from many threads never interleave (a regular file is
//! opened with O_APPEND, where one write() is atomic); nothing is buffered
//! in the process, so no line is lost when the process exits. Diagnostics
//! (start-up, errors) go through the `log` crate to stderr, never here.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;

use crate::logformat::{LogFormat, LogRecord};

/// Where access-log records go.
#[derive(Debug)]
pub enum Sink {
    Stdout,
    File { path: PathBuf, file: File },
}

impl Sink {
    /// Open a file for appending (created with mode 0644 if missing).
    pub fn open(path: &str) -> io::Result<Sink> {
        let file = OpenOptions::new().append(true).create(true).open(path)?;
        Ok(Sink::File {
            path: PathBuf::from(path),
            file,
        })
    }

    /// Write one record (the newline is added here) with a single call.
    pub fn write_line(&self, line: &[u8]) {
        let res = match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line).and_then(|_| out.flush())
            }
            Sink::File { file, .. } => (&*file).write_all(line),
        };
        if let Err(e) = res {
            log::warn!("access log {}: {e}", self.name());
        }
    }

    pub fn name(&self) -> String {
        match self {
            Sink::Stdout => "stdout".into(),
            Sink::File { path, .. } => path.display().to_string(),
        }
    }
}

thread_local! {
    /// One formatting buffer per thread, reused for every record, so logging
    /// allocates nothing once the buffer has grown to a line's size.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Format `rec` with `fmt` and write it to `sink` as one line.
pub fn emit(sink: &Sink, fmt: &LogFormat, rec: &LogRecord<'_>) {
    LINE.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        fmt.render(rec, &mut b);
        b.push(b'\n');
        sink.write_line(&b);
    });
}
