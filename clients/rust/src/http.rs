//! A minimal HTTP/1.1 client over `std::net::TcpStream` (plain http, one request per connection):
//! enough for a service on the same host or network. Bodies with Content-Length or chunked.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub struct Response {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }
}

/// `http://host:port` (path ignored) -> "host:port".
pub fn authority(base_url: &str) -> Result<String, String> {
    let rest = base_url
        .strip_prefix("http://")
        .ok_or_else(|| format!("only http:// URLs are supported: {}", base_url))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(format!("no host in {}", base_url));
    }
    Ok(if host.contains(':') { host.to_string() } else { format!("{}:80", host) })
}

/// Percent-encodes a query or path component.
pub fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{:02X}", b));
        }
    }
    out
}

/// Sends one request and reads the whole answer (`Connection: close`).
pub fn request(
    authority: &str,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, String> {
    let io = |e: std::io::Error| format!("{} {}{}: {}", method, authority, target, e);
    let mut stream = TcpStream::connect(authority).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        method,
        target,
        authority,
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{}: {}\r\n", k, v));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("HTTP: no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "HTTP: headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("HTTP: bad status line {:?}", status_line))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut response = Response { status, headers, body: Vec::new() };
    let rest = &raw[end + 4..];
    response.body = if response.header("transfer-encoding").map_or(false, |v| v.contains("chunked")) {
        dechunk(rest)?
    } else if let Some(n) = response.header("content-length") {
        let n: usize = n.parse().map_err(|_| "HTTP: bad Content-Length")?;
        rest.get(..n).ok_or("HTTP: body shorter than Content-Length")?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok(response)
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").ok_or("HTTP: bad chunk")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|_| "HTTP: bad chunk size")?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| "HTTP: bad chunk size")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(rest.get(..size).ok_or("HTTP: truncated chunk")?);
        rest = rest.get(size + 2..).ok_or("HTTP: truncated chunk")?;
    }
}
