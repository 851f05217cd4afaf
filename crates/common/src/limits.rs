//! Per-call request limits enforced while the request body streams in, so a
//! hostile caller cannot make a service buffer or decode more than the call
//! needs: a byte limit per method, and for batch calls a limit on the number
//! of items, counted on the raw protobuf bytes before anything is decoded.

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Counts the top-level fields of the protobuf messages in a gRPC stream
/// (5-byte prefix, then the message). A batch request has exactly one
/// repeated field, so its field count is its item count.
#[derive(Debug, Clone)]
pub struct FieldCounter {
    state: State,
    /// Bytes of the current message not consumed yet.
    msg_left: u64,
    pub fields: usize,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Reading the 5-byte gRPC prefix: bytes seen, length so far.
    Prefix(u8, u64),
    /// A field key varint: value, shift.
    Key(u64, u32),
    /// A varint field value.
    Varint,
    /// A length prefix: value, shift.
    Len(u64, u32),
    /// Bytes to skip (a field's payload).
    Skip(u64),
    /// A compressed message: not counted.
    Opaque,
}

/// One byte of a varint read so far.
enum Varint {
    /// More bytes follow: the value so far and the next shift.
    More(u64, u32),
    /// The varint ended with this byte.
    Done(u64),
}

/// Reads one more byte `b` of a varint; `too_long` is the error for one of
/// more than ten bytes.
fn varint(v: u64, shift: u32, b: u8, too_long: &'static str) -> Result<Varint, &'static str> {
    let v = v | ((b & 0x7f) as u64) << shift;
    if b & 0x80 == 0 {
        return Ok(Varint::Done(v));
    }
    if shift >= 63 {
        return Err(too_long);
    }
    Ok(Varint::More(v, shift + 7))
}

impl Default for FieldCounter {
    fn default() -> Self {
        FieldCounter {
            state: State::Prefix(0, 0),
            msg_left: 0,
            fields: 0,
        }
    }
}

impl FieldCounter {
    fn next_field(&self) -> State {
        if self.msg_left == 0 {
            State::Prefix(0, 0)
        } else {
            State::Key(0, 0)
        }
    }

    /// Feeds the next bytes of the stream. Errors on bytes that are not a
    /// protobuf message (the decoder would refuse them anyway).
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), &'static str> {
        while !data.is_empty() {
            match self.state {
                State::Opaque => return Ok(()),
                State::Prefix(n, len) => {
                    let b = data[0];
                    data = &data[1..];
                    if n == 0 {
                        if b != 0 {
                            self.state = State::Opaque;
                            return Ok(());
                        }
                        self.state = State::Prefix(1, 0);
                    } else {
                        let len = (len << 8) | b as u64;
                        if n == 4 {
                            self.msg_left = len;
                            self.state = self.next_field();
                        } else {
                            self.state = State::Prefix(n + 1, len);
                        }
                    }
                }
                State::Key(..) | State::Varint | State::Len(..) => {
                    let b = data[0];
                    data = &data[1..];
                    self.msg_left = self
                        .msg_left
                        .checked_sub(1)
                        .ok_or("a field runs past its message")?;
                    self.state = match self.state {
                        State::Key(v, shift) => {
                            match varint(v, shift, b, "field key varint too long")? {
                                Varint::More(v, shift) => State::Key(v, shift),
                                Varint::Done(v) => {
                                    self.fields += 1;
                                    match v & 7 {
                                        0 => State::Varint,
                                        1 => State::Skip(8),
                                        2 => State::Len(0, 0),
                                        5 => State::Skip(4),
                                        _ => return Err("unsupported protobuf wire type"),
                                    }
                                }
                            }
                        }
                        State::Varint if b & 0x80 != 0 => State::Varint,
                        State::Varint => self.next_field(),
                        State::Len(v, shift) => {
                            match varint(v, shift, b, "length varint too long")? {
                                Varint::More(v, shift) => State::Len(v, shift),
                                Varint::Done(0) => self.next_field(),
                                Varint::Done(v) => State::Skip(v),
                            }
                        }
                        _ => unreachable!("matched above"),
                    };
                }
                State::Skip(n) => {
                    if n > self.msg_left {
                        return Err("a field runs past its message");
                    }
                    let k = n.min(data.len() as u64);
                    data = &data[k as usize..];
                    self.msg_left -= k;
                    self.state = if n == k {
                        self.next_field()
                    } else {
                        State::Skip(n - k)
                    };
                }
            }
        }
        Ok(())
    }
}

/// What one call may send.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    pub max_bytes: usize,
    /// Top-level fields (batch items) at most, when counted.
    pub max_items: Option<usize>,
}

/// Request bytes a service holds at once, all calls together: each body's
/// bytes count from when they arrive until the body is dropped (decoded and
/// its buffer freed). A frame that would take the total past the budget
/// fails its call with a retryable `ResourceExhausted`, so many callers'
/// large requests cannot add up to more memory than the service has, though
/// each is within its method's limit.
#[derive(Debug)]
pub struct InflightBudget {
    max: usize,
    used: AtomicUsize,
    /// Calls refused for the budget.
    pub refused: Option<prometheus::IntCounter>,
}

impl InflightBudget {
    pub fn new(max: usize, refused: Option<prometheus::IntCounter>) -> Arc<Self> {
        Arc::new(InflightBudget {
            max,
            used: AtomicUsize::new(0),
            refused,
        })
    }

    /// Request bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn take(&self, n: usize) -> Result<(), usize> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let want = used.checked_add(n).filter(|w| *w <= self.max).ok_or(used)?;
            match self
                .used
                .compare_exchange_weak(used, want, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A request body that fails as soon as it exceeds its limit; the failure is
/// a `tonic::Status`, which the server returns to the caller as is.
pub struct LimitedBody<B> {
    inner: B,
    limit: BodyLimit,
    seen: usize,
    counter: Option<FieldCounter>,
    method: String,
    /// The service's budget and the bytes this body holds of it.
    budget: Option<Arc<InflightBudget>>,
    held: usize,
}

impl<B> Drop for LimitedBody<B> {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give_back(self.held);
        }
    }
}

impl<B> LimitedBody<B> {
    pub fn new(inner: B, limit: BodyLimit, method: &str) -> Self {
        LimitedBody {
            inner,
            limit,
            seen: 0,
            counter: limit.max_items.map(|_| FieldCounter::default()),
            method: method.to_string(),
            budget: None,
            held: 0,
        }
    }

    /// Counts this body's bytes against `budget` as they arrive.
    pub fn within(mut self, budget: Option<Arc<InflightBudget>>) -> Self {
        self.budget = budget;
        self
    }

    fn check(&mut self, data: &Bytes) -> Result<(), tonic::Status> {
        let n = data.remaining();
        self.seen += n;
        if let Some(b) = &self.budget {
            if let Err(used) = b.take(n) {
                if let Some(c) = &b.refused {
                    c.inc();
                }
                return Err(tonic::Status::resource_exhausted(format!(
                    "{} request refused: the service holds {used} bytes of requests at once, \
                     its budget is {}; retry shortly",
                    self.method, b.max
                )));
            }
            self.held += n;
        }
        if self.seen > self.limit.max_bytes {
            return Err(tonic::Status::resource_exhausted(format!(
                "{} request is larger than its limit of {} bytes",
                self.method, self.limit.max_bytes
            )));
        }
        if let (Some(c), Some(max)) = (&mut self.counter, self.limit.max_items) {
            c.feed(data).map_err(|why| {
                tonic::Status::invalid_argument(format!("malformed {} request: {why}", self.method))
            })?;
            if c.fields > max {
                return Err(tonic::Status::invalid_argument(format!(
                    "{} batch has more than {max} items; split it",
                    self.method
                )));
            }
        }
        Ok(())
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    if let Err(st) = this.check(d) {
                        return Poll::Ready(Some(Err(Box::new(st))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A gRPC-framed message with `n` repeated string fields (field 1).
    fn framed(keys: &[&[u8]]) -> Vec<u8> {
        let mut m = Vec::new();
        for k in keys {
            m.push(0x0a); // field 1, wire type 2
            let mut len = k.len() as u64;
            loop {
                let b = (len & 0x7f) as u8;
                len >>= 7;
                if len == 0 {
                    m.push(b);
                    break;
                }
                m.push(b | 0x80);
            }
            m.extend_from_slice(k);
        }
        let mut f = vec![0u8];
        f.extend_from_slice(&(m.len() as u32).to_be_bytes());
        f.extend_from_slice(&m);
        f
    }

    #[test]
    fn counts_items_across_any_split() {
        let long = vec![b'x'; 300];
        let keys: Vec<&[u8]> = vec![b"", b"a", &long, b"", b"bc"];
        let f = framed(&keys);
        for split in 0..f.len() {
            let mut c = FieldCounter::default();
            c.feed(&f[..split]).unwrap();
            c.feed(&f[split..]).unwrap();
            assert_eq!(c.fields, 5, "split at {split}");
        }
        // Varint, fixed64 and fixed32 fields count too.
        let mut c = FieldCounter::default();
        let m = [
            0x08, 0x96, 0x01, 0x11, 1, 2, 3, 4, 5, 6, 7, 8, 0x1d, 1, 2, 3, 4,
        ];
        let mut f = vec![0, 0, 0, 0, m.len() as u8];
        f.extend_from_slice(&m);
        c.feed(&f).unwrap();
        assert_eq!(c.fields, 3);
    }

    #[test]
    fn consecutive_messages_are_counted_from_their_own_prefix() {
        let mut f = framed(&[b"a", b"bb"]);
        f.extend_from_slice(&framed(&[b"", b"c", b"dd"]));
        let mut c = FieldCounter::default();
        c.feed(&f).unwrap();
        assert_eq!(c.fields, 5);
    }

    #[test]
    fn multi_byte_keys_and_varint_values_are_one_field_each() {
        // Field 16 (a two-byte key), then a varint of three bytes, then a
        // one-byte string: three fields.
        let m = [
            0x82, 0x01, 0x01, b'a', 0x08, 0xff, 0xff, 0x03, 0x12, 0x01, b'x',
        ];
        let mut f = vec![0, 0, 0, 0, m.len() as u8];
        f.extend_from_slice(&m);
        let mut c = FieldCounter::default();
        c.feed(&f).unwrap();
        assert_eq!(c.fields, 3);
    }

    #[test]
    fn overlong_varints_are_refused() {
        // A key and a length of eleven continuation bytes.
        let mut key = vec![0, 0, 0, 0, 12];
        key.extend_from_slice(&[0x80; 11]);
        key.push(0);
        assert!(FieldCounter::default().feed(&key).is_err());
        let mut len = vec![0, 0, 0, 0, 13, 0x0a];
        len.extend_from_slice(&[0x80; 11]);
        len.push(0);
        assert!(FieldCounter::default().feed(&len).is_err());
    }

    fn poll(b: &mut LimitedBody<String>) -> Option<Result<Frame<Bytes>, BoxError>> {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        match Pin::new(b).poll_frame(&mut cx) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("a String body is always ready"),
        }
    }

    #[test]
    fn bodies_within_their_limits_pass_and_one_byte_or_item_more_fails() {
        let four = String::from_utf8(framed(&[b"a", b"b", b"c", b"d"])).unwrap();
        let n = four.len();
        let limit = |max_bytes, max_items| BodyLimit {
            max_bytes,
            max_items,
        };
        // Exactly at both limits: the bytes come through unchanged.
        let mut b = LimitedBody::new(four.clone(), limit(n, Some(4)), "M");
        assert!(!b.is_end_stream());
        assert_eq!(b.size_hint().exact(), Some(n as u64));
        let f = poll(&mut b).unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), four.as_bytes());
        assert!(poll(&mut b).is_none());
        assert!(b.is_end_stream());
        // One byte over.
        let mut b = LimitedBody::new(four.clone(), limit(n - 1, None), "M");
        let e = poll(&mut b).unwrap().unwrap_err();
        let st = e.downcast::<tonic::Status>().unwrap();
        assert_eq!(st.code(), tonic::Code::ResourceExhausted);
        assert!(st.message().contains("M request"), "{st}");
        // One item over.
        let mut b = LimitedBody::new(four, limit(n, Some(3)), "M");
        let st = poll(&mut b)
            .unwrap()
            .unwrap_err()
            .downcast::<tonic::Status>()
            .unwrap();
        assert_eq!(st.code(), tonic::Code::InvalidArgument);
        assert!(st.message().contains("more than 3 items"), "{st}");
    }

    #[test]
    fn bodies_share_one_budget_until_they_are_dropped() {
        let four = String::from_utf8(framed(&[b"a", b"b", b"c", b"d"])).unwrap();
        let n = four.len();
        let refused = prometheus::IntCounter::new("r", "r").unwrap();
        let budget = InflightBudget::new(2 * n, Some(refused.clone()));
        let limit = BodyLimit {
            max_bytes: n,
            max_items: None,
        };
        let body = || LimitedBody::new(four.clone(), limit, "M").within(Some(budget.clone()));
        let (mut a, mut b, mut c) = (body(), body(), body());
        assert!(poll(&mut a).unwrap().is_ok());
        assert!(poll(&mut b).unwrap().is_ok());
        assert_eq!(budget.used(), 2 * n);
        // A third body while two are held: refused, retryable, counted.
        let st = poll(&mut c)
            .unwrap()
            .unwrap_err()
            .downcast::<tonic::Status>()
            .unwrap();
        assert_eq!(st.code(), tonic::Code::ResourceExhausted);
        assert!(st.message().contains("budget is"), "{st}");
        assert_eq!(refused.get(), 1);
        drop(c);
        assert_eq!(budget.used(), 2 * n, "a refused body held nothing");
        // Dropping a held body gives its bytes back.
        drop(a);
        assert_eq!(budget.used(), n);
        let mut d = body();
        assert!(poll(&mut d).unwrap().is_ok());
        drop((b, d));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn malformed_messages_are_refused() {
        let mut c = FieldCounter::default();
        // A field claiming more bytes than its message has.
        assert!(c.feed(&[0, 0, 0, 0, 3, 0x0a, 0x7f, 0]).is_err());
        let mut c = FieldCounter::default();
        assert!(c.feed(&[0, 0, 0, 0, 1, 0x0f]).is_err(), "wire type 7");
    }

    proptest! {
        #[test]
        fn never_panics_and_counts_real_messages(
            keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..60),
            junk in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
            let mut c = FieldCounter::default();
            c.feed(&framed(&refs)).unwrap();
            prop_assert_eq!(c.fields, keys.len());
            let _ = FieldCounter::default().feed(&junk);
        }
    }
}
