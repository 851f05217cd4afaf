//! Trace context across processes: the W3C `traceparent` of the current span,
//! carried in gRPC metadata and in data-plane frames.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C header (and gRPC metadata key) that carries a trace context.
const HEADER: &str = "traceparent";

/// A span's identity as a remote parent: trace id, span id and flags
/// (bit 0: sampled), as in a W3C `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// The context of the current span, when it belongs to a sampled trace
    /// (an OTLP exporter is installed, the span is enabled and its trace is
    /// recorded). Cheap otherwise. Unsampled traces are not propagated: the
    /// services would record nothing of them anyway.
    pub fn current() -> Option<TraceParent> {
        let span = tracing::Span::current();
        if span.is_none() {
            return None;
        }
        let cx = span.context();
        let otel = cx.span();
        let sc = otel.span_context();
        (sc.is_valid() && sc.is_sampled()).then(|| TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        })
    }

    /// Makes this remote span the parent of `span` (created but not yet
    /// entered). Invalid (all-zero) ids are ignored.
    pub fn adopt(self, span: &tracing::Span) {
        let sc = SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        );
        if sc.is_valid() {
            let cx = opentelemetry::Context::new().with_remote_span_context(sc);
            let _ = span.set_parent(cx);
        }
    }

    /// `00-<trace id>-<span id>-<flags>`, lower-case hex.
    pub fn to_header(self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        hex(&mut s, &self.trace_id);
        s.push('-');
        hex(&mut s, &self.span_id);
        s.push('-');
        hex(&mut s, &[self.flags]);
        s
    }

    /// Parses a `traceparent` value. Anything malformed, an unknown
    /// version 255 or an all-zero id yields `None`: the request is then
    /// served untraced, never refused.
    pub fn from_header(v: &[u8]) -> Option<TraceParent> {
        let s = std::str::from_utf8(v).ok()?.trim();
        let mut parts = s.split('-');
        let version = parts.next()?;
        let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has exactly four fields; later versions may add more.
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        unhex::<1>(version)?;
        let tp = TraceParent {
            trace_id: unhex(trace)?,
            span_id: unhex(span)?,
            flags: unhex::<1>(flags)?[0],
        };
        (tp.trace_id != [0; 16] && tp.span_id != [0; 8]).then_some(tp)
    }
}

fn hex(out: &mut String, b: &[u8]) {
    const D: &[u8; 16] = b"0123456789abcdef";
    for x in b {
        out.push(D[(x >> 4) as usize] as char);
        out.push(D[(x & 15) as usize] as char);
    }
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (digit(b[2 * i])? << 4) | digit(b[2 * i + 1])?;
    }
    Some(out)
}

/// Adds the current span's context to an outgoing gRPC call, if any.
pub fn inject_grpc(md: &mut tonic::metadata::MetadataMap) {
    if let Some(tp) = TraceParent::current() {
        if let Ok(v) = tp.to_header().parse() {
            md.insert(HEADER, v);
        }
    }
}

/// The server span of a gRPC call that came with a trace context (`path`
/// is `/package.Service/Method`); `None` for an untraced call, so untraced
/// traffic creates no span.
pub fn grpc_server_span(headers: &http::HeaderMap, path: &str) -> Option<tracing::Span> {
    let parent = TraceParent::from_header(headers.get(HEADER)?.as_bytes())?;
    let name = path.trim_start_matches('/');
    let (service, method) = name.rsplit_once('/').unwrap_or(("", name));
    let span = tracing::info_span!(
        "grpc",
        otel.name = name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
    );
    parent.adopt(&span);
    Some(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let tp = TraceParent {
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
            flags: 1,
        };
        let h = tp.to_header();
        assert_eq!(h, "00-abababababababababababababababab-0101010101010101-01");
        assert_eq!(TraceParent::from_header(h.as_bytes()), Some(tp));
        // A later version with an extra field is read; version 00 is strict.
        let later = format!("01-{}-x", &h[3..]);
        assert_eq!(TraceParent::from_header(later.as_bytes()), Some(tp));
        assert_eq!(TraceParent::from_header(format!("{h}-x").as_bytes()), None);
    }

    #[test]
    fn malformed_headers_are_ignored() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(TraceParent::from_header(good.as_bytes()).is_some());
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceParent::from_header(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn no_context_without_an_exporter() {
        // No OTLP layer: spans have no trace id, so nothing is propagated.
        let span = tracing::info_span!("x");
        let _in = span.enter();
        assert_eq!(TraceParent::current(), None);
        let mut md = tonic::metadata::MetadataMap::new();
        inject_grpc(&mut md);
        assert!(md.get(HEADER).is_none());
    }
}
