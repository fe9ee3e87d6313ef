//! Records enqueued on a producer through a topic handle kept per topic.
//!
//! rust-rdkafka's `BaseProducer::send` names the topic on every record: a C string of the
//! name is allocated, and librdkafka looks the topic up by name under its lock and lets it go
//! again. Here each topic is looked up once, when its first record is enqueued
//! (`rd_kafka_topic_new`), and its handle is given to `rd_kafka_produceva` for every record
//! after that (a recent topic's is found without hashing the name, see [`RecentTopics`]). Everything else is enqueued as `BaseProducer::send` does: key and value copied
//! (`RD_KAFKA_MSG_F_COPY`), the partition unassigned when the record names none, timestamp 0
//! (the time of enqueueing) when it has none, and the caller's token as the opaque that
//! `BaseProducer::poll` turns back into the token of the delivery report.
//!
//! # Invariants
//! - Headers ([`NativeHeaders`]) are owned here until librdkafka takes a record: on success
//!   they pass to librdkafka with it (and are not destroyed here); on a failure they stay owned
//!   here, so a record refused for good destroys them when it is dropped and one refused for a
//!   full queue is offered again with the same headers.
//! - A topic handle lives no longer than its producer: [`TopicHandles`] holds a reference to
//!   the producer, and destroys every handle before letting that reference go. A producer's
//!   handles are its own: a rebuilt producer starts with none.
//! - A handle is created only for a topic name that librdkafka accepted, and destroyed once,
//!   from the map (the copies kept as recent ones are never destroyed).
//! - The only `unsafe` is librdkafka's calls on the producer's client, on handles owned here,
//!   and on header lists owned here until librdkafka takes them.
#![allow(unsafe_code)]

use rdkafka::bindings as rd;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::IntoOpaque;
use rustc_hash::FxHashMap;
use siphon_record::{Header, RecentTopics, RoutedRecord};
use std::ffi::{c_void, CString};
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// librdkafka's `RD_KAFKA_PARTITION_UA` (a macro the bindings do not carry): the partitioner
/// chooses.
const PARTITION_UNASSIGNED: i32 = -1;

/// A topic's handle on one producer (a copy is the same handle, destroyed once by
/// [`TopicHandles`]).
#[derive(Clone, Copy)]
struct TopicHandle(NonNull<rd::rd_kafka_topic_t>);

// SAFETY: librdkafka's topic handles are reference-counted and locked internally; they may be
// used and destroyed from any thread.
unsafe impl Send for TopicHandle {}
// SAFETY: as above.
unsafe impl Sync for TopicHandle {}

/// The topic handles of one producer, and the producer they belong to.
pub(crate) struct TopicHandles<C: ProducerContext<DeliveryOpaque = usize> + 'static> {
    handles: FxHashMap<String, TopicHandle>,
    /// The handles used last, found again without hashing their topics' names.
    recent: RecentTopics<TopicHandle>,
    producer: Arc<BaseProducer<C>>,
}

impl<C: ProducerContext<DeliveryOpaque = usize> + 'static> TopicHandles<C> {
    /// No handles yet: each topic's is created with its first record.
    pub(crate) fn new(producer: Arc<BaseProducer<C>>) -> Self {
        TopicHandles {
            handles: FxHashMap::default(),
            recent: RecentTopics::default(),
            producer,
        }
    }

    /// The handle of `topic`, created on first use.
    fn handle(&mut self, topic: &Arc<str>) -> Result<NonNull<rd::rd_kafka_topic_t>, KafkaError> {
        if let Some(handle) = self.recent.get(topic) {
            return Ok(handle.0);
        }
        let handle = match self.handles.get(&**topic) {
            Some(handle) => *handle,
            None => self.create(topic)?,
        };
        self.recent.keep(topic, handle);
        Ok(handle.0)
    }

    /// A new handle of `topic`, kept until the producer goes.
    fn create(&mut self, topic: &str) -> Result<TopicHandle, KafkaError> {
        let name = CString::new(topic).map_err(KafkaError::Nul)?;
        // SAFETY: the client pointer is valid while `self.producer` is, which this holds; the
        // name is a valid C string that librdkafka copies; a NULL configuration takes the
        // producer's default topic configuration. The handle returned is destroyed in `drop`.
        let handle = unsafe {
            rd::rd_kafka_topic_new(
                self.producer.client().native_ptr(),
                name.as_ptr(),
                ptr::null_mut(),
            )
        };
        let Some(handle) = NonNull::new(handle) else {
            // SAFETY: reads the calling thread's last error, which `rd_kafka_topic_new` set.
            let code = unsafe { rd::rd_kafka_last_error() };
            return Err(KafkaError::MessageProduction(code.into()));
        };
        let handle = TopicHandle(handle);
        self.handles.insert(topic.to_owned(), handle);
        Ok(handle)
    }

    /// The number of topics with a handle.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.handles.len()
    }

    /// Enqueues `outgoing`. On failure it comes back, its headers still owned by it, with the
    /// error (as `BaseProducer::send` reports it).
    pub(crate) fn produce<'a>(
        &mut self,
        outgoing: Outgoing<'a>,
    ) -> Result<(), (KafkaError, Outgoing<'a>)> {
        let record = outgoing.record;
        let topic = match self.handle(&record.topic) {
            Ok(handle) => handle,
            Err(error) => return Err((error, outgoing)),
        };
        let (value, value_len) = bytes(record.value.as_deref());
        let (key, key_len) = bytes(record.key.as_deref());
        let headers = outgoing
            .headers
            .as_ref()
            .map_or(ptr::null_mut(), |h| h.0.as_ptr());
        let fields = [
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_RKT,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    rkt: topic.as_ptr(),
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    i32_: record.partition.unwrap_or(PARTITION_UNASSIGNED),
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    i: rd::RD_KAFKA_MSG_F_COPY,
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: value,
                        size: value_len,
                    },
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: key,
                        size: key_len,
                    },
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_OPAQUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    // What `BaseProducer::poll` turns back into the token (`usize::from_ptr`).
                    ptr: outgoing.token.into_ptr(),
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TIMESTAMP,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    i64_: record.timestamp_ms.unwrap_or(0),
                },
            ),
            field(
                rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS,
                rd::rd_kafka_vu_s__bindgen_ty_1 { headers },
            ),
        ];
        // SAFETY: the client pointer is valid while `self.producer` is; the topic handle is
        // this producer's and alive until `drop`; each field's union member is the one its
        // type names; key and value are copied (`RD_KAFKA_MSG_F_COPY`) before this returns;
        // the header list is owned by `outgoing` and taken by librdkafka only on success.
        let error = unsafe {
            rd::rd_kafka_produceva(
                self.producer.client().native_ptr(),
                fields.as_ptr(),
                fields.len(),
            )
        };
        let Some(error) = NonNull::new(error) else {
            // The headers are librdkafka's now.
            std::mem::forget(outgoing.headers);
            return Ok(());
        };
        // SAFETY: `error` is a valid error object owned here, read and then destroyed once.
        let code = unsafe {
            let code = rd::rd_kafka_error_code(error.as_ptr());
            rd::rd_kafka_error_destroy(error.as_ptr());
            code
        };
        let code: RDKafkaErrorCode = code.into();
        Err((KafkaError::MessageProduction(code), outgoing))
    }
}

impl<C: ProducerContext<DeliveryOpaque = usize> + 'static> Drop for TopicHandles<C> {
    fn drop(&mut self) {
        for (_, handle) in self.handles.drain() {
            // SAFETY: each handle was created by `rd_kafka_topic_new` on this producer, which
            // `self.producer` keeps alive until after this; it is destroyed once, here.
            unsafe { rd::rd_kafka_topic_destroy(handle.0.as_ptr()) };
        }
        // The producer reference goes with the fields, after its handles.
    }
}

/// A record to enqueue, with its token and its headers as librdkafka takes them.
pub(crate) struct Outgoing<'a> {
    record: &'a RoutedRecord,
    token: usize,
    /// `None` for a record without headers.
    headers: Option<NativeHeaders>,
}

impl<'a> Outgoing<'a> {
    /// `record`, to be reported with `token`; its headers are copied into a header list.
    pub(crate) fn new(record: &'a RoutedRecord, token: usize) -> Self {
        Outgoing {
            record,
            token,
            headers: NativeHeaders::copy(&record.headers),
        }
    }
}

/// A librdkafka header list, owned until a record that carries it is enqueued.
pub(crate) struct NativeHeaders(NonNull<rd::rd_kafka_headers_t>);

// SAFETY: the list is owned by this value alone; librdkafka's header calls take no lock that
// ties it to a thread.
unsafe impl Send for NativeHeaders {}
// SAFETY: nothing reads or writes the list through a shared reference.
unsafe impl Sync for NativeHeaders {}

impl NativeHeaders {
    /// A list with a copy of each of `headers`, in order; `None` without headers (the record
    /// then carries no list, as it would carry an empty one).
    fn copy(headers: &[Header]) -> Option<Self> {
        if headers.is_empty() {
            return None;
        }
        // SAFETY: allocates a new list, owned by the value returned.
        let list = unsafe { rd::rd_kafka_headers_new(headers.len()) };
        let list = NativeHeaders(
            NonNull::new(list).expect("librdkafka aborts rather than fail an allocation"),
        );
        for header in headers {
            let (value, value_len) = bytes(header.value.as_deref());
            // SAFETY: the list is valid and owned here; name and value are read (with their
            // lengths, so neither needs a terminating NUL) and copied before this returns. A
            // slice is never longer than `isize::MAX`. A new list is not read-only, the only
            // case in which adding fails.
            unsafe {
                rd::rd_kafka_header_add(
                    list.0.as_ptr(),
                    header.name.as_ptr().cast(),
                    header.name.len() as isize,
                    value,
                    value_len as isize,
                );
            }
        }
        Some(list)
    }
}

impl Drop for NativeHeaders {
    fn drop(&mut self) {
        // SAFETY: the list is owned here (librdkafka took none that is still in a value:
        // `TopicHandles::produce` forgets those); it is destroyed once.
        unsafe { rd::rd_kafka_headers_destroy(self.0.as_ptr()) };
    }
}

/// A field of `rd_kafka_produceva`'s list.
fn field(vtype: rd::rd_kafka_vtype_t, u: rd::rd_kafka_vu_s__bindgen_ty_1) -> rd::rd_kafka_vu_t {
    rd::rd_kafka_vu_t { vtype, u }
}

/// Pointer and length of optional bytes: null and 0 for none.
fn bytes(bytes: Option<&[u8]>) -> (*mut c_void, usize) {
    match bytes {
        // librdkafka copies from the pointer; it never writes through it.
        Some(b) => (b.as_ptr().cast_mut().cast(), b.len()),
        None => (ptr::null_mut(), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use rdkafka::config::ClientConfig;
    use rdkafka::message::{Headers, Message};
    use rdkafka::producer::{BaseRecord, DeliveryResult, PurgeConfig};
    use rdkafka::ClientContext;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// A report as the test context saw it: the token and the headers librdkafka held.
    type Report = (usize, Vec<(String, Option<Vec<u8>>)>);

    /// Keeps every delivery report's token and headers.
    #[derive(Default)]
    struct Reports(Mutex<Vec<Report>>);

    impl ClientContext for Reports {}

    impl ProducerContext for Reports {
        type DeliveryOpaque = usize;

        fn delivery(&self, result: &DeliveryResult<'_>, token: usize) {
            let message = match result {
                Ok(message) | Err((_, message)) => message,
            };
            let headers = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default();
            self.0.lock().unwrap().push((token, headers));
        }
    }

    /// A producer whose brokers never answer (nothing listens on the port), so records stay
    /// queued until purged; its queue holds `capacity` records.
    fn queued_producer(capacity: usize) -> Arc<BaseProducer<Reports>> {
        let port = siphon_tests::free_port();
        let producer: BaseProducer<Reports> = ClientConfig::new()
            .set("bootstrap.servers", format!("127.0.0.1:{port}"))
            .set("queue.buffering.max.messages", capacity.to_string())
            .create_with_context(Reports::default())
            .expect("a producer");
        Arc::new(producer)
    }

    /// Purges the queue and serves reports until `count` have arrived in all.
    fn purge_and_serve(producer: &BaseProducer<Reports>, count: usize) -> Vec<Report> {
        producer.purge(PurgeConfig::default().queue());
        let deadline = Instant::now() + Duration::from_secs(10);
        while producer.context().0.lock().unwrap().len() < count {
            assert!(Instant::now() < deadline, "the purged records are reported");
            producer.poll(Duration::from_millis(50));
        }
        producer.context().0.lock().unwrap().clone()
    }

    fn record(topic: &str, headers: &[(&str, Option<&'static [u8]>)]) -> RoutedRecord {
        RoutedRecord {
            topic: topic.into(),
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers: headers
                .iter()
                .map(|&(name, value)| Header {
                    name: Arc::from(name),
                    value: value.map(Bytes::from_static),
                })
                .collect(),
            timestamp_ms: None,
            partition: None,
        }
    }

    /// A record offered to a full queue comes back with its headers, and offered again once
    /// the queue has room it carries them; the token comes back with each report.
    #[test]
    fn a_record_refused_for_a_full_queue_keeps_its_headers_for_the_next_offer() {
        let producer = queued_producer(1);
        let mut handles = TopicHandles::new(Arc::clone(&producer));
        let first = record("t", &[]);
        let second = record(
            "t",
            &[("id", Some(b"42")), ("none", None), ("id", Some(b""))],
        );
        assert!(handles.produce(Outgoing::new(&first, 7)).is_ok());
        let returned = match handles.produce(Outgoing::new(&second, 8)) {
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => returned,
            other => panic!("the queue holds one record: {:?}", other.err().map(|e| e.0)),
        };
        assert!(returned.headers.is_some(), "still owned by the record");
        assert_eq!(purge_and_serve(&producer, 1), vec![(7, vec![])]);
        assert!(handles.produce(returned).is_ok(), "room again");
        let expected = vec![
            ("id".to_owned(), Some(b"42".to_vec())),
            ("none".to_owned(), None),
            ("id".to_owned(), Some(vec![])),
        ];
        assert_eq!(purge_and_serve(&producer, 2)[1], (8, expected));
        assert_eq!(handles.handles.len(), 1, "one handle for the one topic");
    }

    /// A topic name librdkafka refuses fails as `BaseProducer::send` fails it, and leaves no
    /// handle behind; a producer's handles are one per topic.
    #[test]
    fn refused_topic_names_fail_as_a_send_by_name_does() {
        let producer = queued_producer(100);
        let mut handles = TopicHandles::new(Arc::clone(&producer));
        for name in ["with\0nul".to_owned(), "x".repeat(513)] {
            let by_name = producer
                .send(BaseRecord::<[u8], [u8], usize>::with_opaque_to(&name, 1).payload(b"v"))
                .map_err(|(e, _)| e)
                .expect_err("refused by name");
            let refused = record(&name, &[("h", Some(b"v"))]);
            let by_handle = handles
                .produce(Outgoing::new(&refused, 1))
                .map_err(|(e, _)| e)
                .expect_err("refused by handle");
            assert_eq!(by_handle.to_string(), by_name.to_string());
            assert_eq!(by_handle.rdkafka_error_code(), by_name.rdkafka_error_code());
        }
        assert!(handles.handles.is_empty());
        for (token, topic) in [(1, "a"), (2, "b"), (3, "a")] {
            assert!(handles
                .produce(Outgoing::new(&record(topic, &[]), token))
                .is_ok());
        }
        assert_eq!(handles.handles.len(), 2);
        // Reports are in order per partition, not across topics.
        let mut tokens: Vec<usize> = purge_and_serve(&producer, 3).iter().map(|r| r.0).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, vec![1, 2, 3]);
    }
}
