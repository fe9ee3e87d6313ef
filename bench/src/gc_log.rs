//! The bench's broker's garbage-collection pauses, from its GC log (`-Xlog:gc`, as Kafka's
//! start scripts write `kafkaServer-gc.log`), over a stretch of the run: the log's length is
//! taken at the start and the lines written after it are read at the end.
//!
//! # Invariants
//! - Only stop-the-world pauses count (`Pause Young`, `Pause Remark`, `Pause Full` ...), not
//!   the concurrent phases G1 runs beside the application.
//! - A log that does not exist (a broker given with `--bootstrap`) reads as no stretch at all.

use std::path::{Path, PathBuf};

/// The file name, in the broker's own directory (its working directory).
pub const FILE: &str = "kafkaServer-gc.log";

/// The JVM option that writes it (what `kafka-run-class.sh` adds for a broker, less the
/// tags: one line per collection).
pub const JVM_OPTION: &str =
    "-Xlog:gc:file=kafkaServer-gc.log:time,uptime:filecount=2,filesize=100M";

/// Stop-the-world pauses in a stretch of the log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GcPauses {
    pub count: u32,
    pub longest_ms: f64,
    pub total_ms: f64,
}

/// Where a stretch of the log starts.
pub struct Mark {
    path: PathBuf,
    offset: u64,
}

/// Marks the end of the log at `path` now (a missing log: None).
pub fn mark(path: &Path) -> Option<Mark> {
    let offset = std::fs::metadata(path).ok()?.len();
    Some(Mark {
        path: path.to_owned(),
        offset,
    })
}

/// The pauses logged since `mark` (None if the log cannot be read or was rotated meanwhile).
pub fn pauses_since(mark: &Mark) -> Option<GcPauses> {
    let text = std::fs::read(&mark.path).ok()?;
    let offset = usize::try_from(mark.offset).ok()?;
    let since = text.get(offset..)?;
    Some(pauses_in(&String::from_utf8_lossy(since)))
}

/// The pauses in `text`: lines such as
/// `[2026-12-03T10:55:01.123+0000][12.345s] GC(3) Pause Young (Normal) (G1 Evacuation Pause) 51M->10M(1024M) 4.567ms`.
pub fn pauses_in(text: &str) -> GcPauses {
    let mut pauses = GcPauses::default();
    for line in text.lines().filter(|l| l.contains(" Pause ")) {
        let Some(ms) = line
            .rsplit(' ')
            .next()
            .and_then(|last| last.strip_suffix("ms"))
            .and_then(|ms| ms.parse::<f64>().ok())
        else {
            continue;
        };
        pauses.count += 1;
        pauses.total_ms += ms;
        pauses.longest_ms = pauses.longest_ms.max(ms);
    }
    pauses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_are_counted_and_concurrent_phases_are_not() {
        let text = "\
[2026-12-03T10:55:01.100+0000][1.000s] Using G1
[2026-12-03T10:55:01.123+0000][12.345s] GC(3) Pause Young (Normal) (G1 Evacuation Pause) 51M->10M(1024M) 4.567ms
[2026-12-03T10:55:02.000+0000][13.000s] GC(4) Concurrent Mark Cycle
[2026-12-03T10:55:02.010+0000][13.010s] GC(4) Pause Remark 60M->60M(1024M) 1.250ms
[2026-12-03T10:55:02.500+0000][13.500s] GC(4) Concurrent Mark Cycle 512.000ms
[2026-12-03T10:55:03.000+0000][14.000s] GC(5) Pause Full (G1 Compaction Pause) 900M->200M(1024M) 250.000ms
";
        let pauses = pauses_in(text);
        assert_eq!(pauses.count, 3);
        assert!((pauses.longest_ms - 250.0).abs() < 1e-9);
        assert!((pauses.total_ms - 255.817).abs() < 1e-9);
        assert_eq!(pauses_in(""), GcPauses::default());
    }

    #[test]
    fn only_what_was_written_after_the_mark_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        assert!(mark(&path).is_none(), "no log, no stretch");
        std::fs::write(
            &path,
            "[t][1s] GC(1) Pause Young (Normal) 1M->1M(8M) 9.000ms\n",
        )
        .unwrap();
        let from = mark(&path).unwrap();
        let mut log = std::fs::read_to_string(&path).unwrap();
        log += "[t][2s] GC(2) Pause Young (Normal) 1M->1M(8M) 2.000ms\n";
        std::fs::write(&path, log).unwrap();
        let pauses = pauses_since(&from).unwrap();
        assert_eq!(pauses.count, 1);
        assert!((pauses.longest_ms - 2.0).abs() < 1e-9);
    }
}
