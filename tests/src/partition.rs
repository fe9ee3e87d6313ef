//! Kafka's default key partitioning: murmur2 as the Java client computes it, to check from the
//! outside that librdkafka's `murmur2_random` partitioner puts each record where Kafka Connect
//! would have.
//!
//! The Java producer sends a keyed record to partition
//! `toPositive(Utils.murmur2(keyBytes)) % numPartitions`; [`partition_for_key`] does the same so
//! a record lands where Kafka Connect would have put it (librdkafka's `murmur2_random`
//! partitioner agrees for every non-null key).
//!
//! # Invariants
//! - [`murmur2`] equals `org.apache.kafka.common.utils.Utils.murmur2` for every input: 32-bit
//!   wrapping arithmetic, logical right shifts, little-endian 4-byte blocks and the same tail
//!   handling.
//! - [`partition_for_key`] never panics and returns a value in `0..partitions` when
//!   `partitions > 0`.

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;
const R: u32 = 24;

/// Kafka's murmur2 hash of `data`, as the Java client's `Utils.murmur2` returns it (a Java
/// `int`).
///
/// The length enters the hash as a 32-bit value, as in Java, where arrays cannot be longer.
pub fn murmur2(data: &[u8]) -> i32 {
    // Java arrays hold at most i32::MAX elements; truncating matches `int length`.
    let length = data.len() as u32;
    let mut h = SEED ^ length;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        if let Some(&b) = tail.get(2) {
            h ^= u32::from(b) << 16;
        }
        if let Some(&b) = tail.get(1) {
            h ^= u32::from(b) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's Java producer picks for `key` among `partitions` partitions:
/// `(murmur2(key) & 0x7fffffff) % partitions`.
///
/// Returns 0 when `partitions <= 0` (a topic always has at least one partition; the caller
/// passes the topic's partition count).
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    if partitions <= 0 {
        return 0;
    }
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Kafka `clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java`,
    /// `testMurmur2`.
    #[test]
    fn kafka_utils_test_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key), expected, "{}", String::from_utf8_lossy(key));
        }
    }

    /// librdkafka `src/rdmurmur2.c`, `unittest_murmurhashneutral2`: the Java client's
    /// results, stored as `toPositive(murmur2(key))`.
    #[test]
    fn librdkafka_vectors() {
        let cases: [(&[u8], i32); 3] = [
            (b"kafka", 1_348_980_580),
            (b"amqp", 767_747_138),
            (b"giberish123456789", 257_239_820),
        ];
        for (key, expected) in cases {
            assert_eq!(
                murmur2(key) & 0x7fff_ffff,
                expected,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }

    /// KafkaJS `src/producer/partitioners/defaultJava/murmur2.spec.js`: values generated with
    /// the Java client's algorithm (`defaultJava/Test.java`); keys of every tail length.
    #[test]
    fn kafkajs_java_generated_vectors() {
        let cases: [(&str, i32); 17] = [
            ("0", 971_027_396),
            ("1", -1_993_445_489),
            ("128", -326_012_175),
            ("2187", -1_508_407_203),
            ("16384", -325_739_742),
            ("78125", -1_654_490_814),
            ("279936", 1_462_227_128),
            ("823543", -2_014_198_330),
            ("2097152", 607_668_903),
            ("4782969", -1_182_699_775),
            ("10000000", -1_830_336_757),
            ("19487171", -1_603_849_305),
            ("35831808", -857_013_643),
            ("62748517", -1_167_431_028),
            ("105413504", -381_294_639),
            ("170859375", -1_658_323_481),
            ("100:48069", 1_009_543_857),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key.as_bytes()), expected, "{key}");
        }
    }

    #[test]
    fn partition_is_the_positive_hash_modulo_the_count() {
        // murmur2("21") = -973932308; & 0x7fffffff = 1173551340.
        assert_eq!(partition_for_key(b"21", 1), 0);
        assert_eq!(partition_for_key(b"21", 10), 1_173_551_340 % 10);
        assert_eq!(partition_for_key(b"21", 7), 1_173_551_340 % 7);
        assert_eq!(partition_for_key(b"kafka", 100), 1_348_980_580 % 100);
        assert_eq!(partition_for_key(b"", 3), (murmur2(b"") & 0x7fff_ffff) % 3);
    }

    #[test]
    fn no_partitions_gives_zero() {
        assert_eq!(partition_for_key(b"k", 0), 0);
        assert_eq!(partition_for_key(b"k", -5), 0);
    }

    proptest! {
        #[test]
        fn partition_is_in_range(key in proptest::collection::vec(any::<u8>(), 0..64), n in 1..10_000i32) {
            let p = partition_for_key(&key, n);
            prop_assert!((0..n).contains(&p));
        }
    }
}
