//! Siphon's benchmark: `scripts/bench.sh [N]` builds and runs it. See docs/performance.md.
//!
//! One run writes a backlog of outbox events behind one logical slot per drain (all created
//! before the backlog, so each drains the same WAL): slot A with pg_recvlogical (the physical
//! limit of the slot stream), slot B with Siphon to Kafka, slot B-EOS with Siphon to Kafka in
//! exactly-once mode (`--no-exactly-once` skips it), slot C with Siphon's discard sink, three
//! slots with Siphon writing expanded JSON, expanded Avro and Avro values through a rivven-schema
//! registry the bench starts (`--no-avro` skips them), a Debezium slot with Debezium's embedded engine (when Java and its jars are installed) and,
//! with `--contention`, three more slots drained like A, B and C while a CPU hog runs. Then it
//! measures commit-to-ack latency under a steady load on a fresh slot, next to a probe
//! producer's own produce latency, and again in exactly-once mode on another fresh slot (at
//! `--eos-latency-rate`). It prints one table and writes it as JSON to
//! target/bench/result.json. It starts PostgreSQL and an Apache Kafka node (KRaft, with the JVM
//! options of Kafka's own start scripts) through the test harness unless `--pg-url` /
//! `--bootstrap` name existing ones, and stops everything it started. Its own broker is warmed
//! up before anything is measured (`warm_up.rs`: records from a producer, then Siphon's own
//! drains until the broker's JIT compilers are nearly idle), and keeps
//! every record for the whole run: the contended drains and the latency phase write to it after
//! the backlog's drains.

mod avro;
mod backlog;
mod chart;
mod cli;
mod connect;
mod debezium;
mod drain;
mod gc_log;
mod hog;
mod host;
mod latency;
mod pressure;
mod probe;
mod procstat;
mod promhist;
mod report;
mod services;
mod slots;
mod values;
mod warm_up;
mod workload;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use std::path::PathBuf;
use std::time::Duration;

fn main() {
    if let Some(threads) = hog::program_threads() {
        hog::run_program(threads);
    }
    let args = cli::Args::parse();
    if let Err(e) = args.validate() {
        eprintln!("bench: ERROR: {e:#}");
        std::process::exit(2);
    }
    // The services start before the Tokio runtime, while this is the only thread: the
    // environment changes below are then safe.
    //
    // The harness starts the bench's broker with SIPHON_BROKER_JVM_OPTS.
    // With its GC log, as Kafka's start scripts write it: the latency phase reads its pauses.
    std::env::set_var(
        "SIPHON_BROKER_JVM_OPTS",
        format!("{} {}", services::kafka_jvm_opts(), gc_log::JVM_OPTION),
    );
    // ... in a session of its own, as the service it is (see `hog`).
    std::env::set_var("SIPHON_BROKER_OWN_SESSION", "1");
    let svc = services::Services::start(
        args.pg_url.clone(),
        args.bootstrap.clone(),
        args.broker_name.clone(),
        args.pg_recvlogical.clone(),
        !args.no_avro,
    );
    let svc = match svc {
        Ok(svc) => svc,
        Err(e) => {
            eprintln!("bench: ERROR: starting services: {e:#}");
            std::process::exit(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the Tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            r = run(&args, &svc) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    // Dropping the runtime drops every task (and the Siphon processes they started), then
    // dropping the services stops what was started for the run.
    drop(runtime);
    drop(svc);
    if let Err(e) = outcome {
        eprintln!("bench: ERROR: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: &cli::Args, svc: &services::Services) -> Result<()> {
    eprintln!(
        "bench: PostgreSQL {}, broker {} at {}{}, siphon {}",
        svc.pg_url,
        svc.broker_name,
        svc.bootstrap,
        svc.broker_pid.map_or(
            " (process not found: no broker CPU figures)".to_owned(),
            |pid| format!(" (pid {pid})")
        ),
        siphon_tests::siphon_bin()?.display()
    );
    if svc.owns_broker() {
        let secs = warm_up::records(svc, args.warm_up_records).await?;
        eprintln!(
            "bench: warmed the broker up: {} records and one transaction to {} in {secs:.1} s",
            args.warm_up_records,
            warm_up::WARM_UP_TOPIC
        );
    }
    let db = svc.connect().await?;
    let outcome = measure(args, svc, &db).await;
    // Leave an external server as it was; a scratch one is stopped with `svc`.
    if let Err(e) = workload::drop_objects(&db).await {
        eprintln!("bench: cleanup: {e:#}");
    }
    let results = outcome?;

    let table = results.table();
    println!("{table}");
    let json = serde_json::to_string_pretty(&results.json())?;
    let mut paths = vec![siphon_tests::workspace_root().join("target/bench/result.json")];
    paths.extend(args.json.clone());
    for path in paths {
        write_file(&path, &json)?;
        eprintln!("bench: wrote {}", path.display());
    }
    let svg_path = siphon_tests::workspace_root().join("target/bench/result.svg");
    write_file(&svg_path, &chart::svg(&results.chart()))?;
    eprintln!("bench: wrote {}", svg_path.display());
    if let Some(failure) = &results.failure {
        anyhow::bail!("{failure}");
    }
    anyhow::ensure!(
        results.records_match(),
        "a drain handed a different number of records to its sink than the backlog's {} events (see the table)",
        args.events
    );
    Ok(())
}

async fn measure(
    args: &cli::Args,
    svc: &services::Services,
    db: &tokio_postgres::Client,
) -> Result<report::Results> {
    let calibration_ms_before = host::calibration_ms();
    eprintln!("bench: host calibration: {calibration_ms_before:.0} ms");
    let timeout = Duration::from_secs(args.drain_timeout_secs);
    let slot = |s: &str| format!("{}{s}", workload::SLOT_PREFIX);
    let [slot_a, slot_b, slot_eos, slot_c, slot_dbz, slot_lat, slot_lat_eos] =
        ["a", "b", "b_eos", "c", "debezium", "latency", "latency_eos"].map(slot);
    let connect_slots = connect::Producer::ALL.map(|p| (p, slot(&format!("connect_{}", p.slug()))));
    // The all-operations publication's drains: pg_recvlogical, Siphon to the broker and the
    // Connect rows, each on a slot of its own.
    let [all_a, all_b] = ["all_a", "all_b"].map(slot);
    let all_connect_slots =
        connect::Producer::ALL.map(|p| (p, slot(&format!("all_connect_{}", p.slug()))));
    let [hog_a, hog_b, hog_c] = ["a_hog", "b_hog", "c_hog"].map(slot);
    let [hog_all_a, hog_all_b] = ["all_a_hog", "all_b_hog"].map(slot);
    let avro_slots = avro::slots(slot);

    let debezium = if args.no_debezium {
        Err("skipped: --no-debezium".to_owned())
    } else {
        eprintln!("bench: looking for Java and the Debezium jars ...");
        tokio::task::block_in_place(debezium::locate).map_err(|why| format!("skipped: {why}"))
    };
    if let Err(why) = &debezium {
        eprintln!("bench: debezium row {why}");
    }
    let connect_install = if args.no_connect {
        Err("skipped: --no-connect".to_owned())
    } else {
        eprintln!("bench: looking for the Kafka Connect worker (scripts/install-connect.sh) ...");
        tokio::task::block_in_place(connect::locate).map_err(|why| format!("skipped: {why}"))
    };
    if let Err(why) = &connect_install {
        eprintln!("bench: Debezium on Connect rows {why}");
    }
    match &svc.registry {
        Ok(r) => eprintln!("bench: schema registry rivven-schema at {}", r.url()),
        Err(why) => eprintln!("bench: Avro rows {why}"),
    }

    workload::prepare(db).await?;
    let warm_up_drains = if svc.owns_broker() && args.warm_up_drains > 0 {
        eprintln!(
            "bench: warming the broker up with Siphon's drains of {} events (at most {}) ...",
            args.warm_up_drain_events, args.warm_up_drains
        );
        let drains = warm_up::siphon_drains(
            svc,
            db,
            args.warm_up_drain_events,
            args.txn_events,
            args.warm_up_drains,
            !args.no_exactly_once,
            timeout,
        )
        .await?;
        Some(drains)
    } else {
        None
    };
    // Every drain's slot exists before the backlog is written: each decodes the same WAL.
    let mut slots = vec![&slot_a, &slot_b, &slot_c];
    if !args.no_exactly_once {
        slots.push(&slot_eos);
    }
    if svc.registry.is_ok() {
        slots.extend(&avro_slots);
    }
    if debezium.is_ok() {
        slots.push(&slot_dbz);
    }
    if connect_install.is_ok() {
        slots.extend(connect_slots.iter().map(|(_, s)| s));
    }
    if !args.no_all_operations {
        slots.extend([&all_a, &all_b]);
        if connect_install.is_ok() {
            slots.extend(all_connect_slots.iter().map(|(_, s)| s));
        }
    }
    if args.contention {
        slots.extend([&hog_a, &hog_b, &hog_c]);
        if !args.no_all_operations {
            slots.extend([&hog_all_a, &hog_all_b]);
        }
    }
    for slot in slots {
        workload::create_slot(db, slot).await?;
    }

    eprintln!("bench: writing {} events ...", args.events);
    let (backlog, end_text, end_lsn) = backlog::write(svc, args.events, args.txn_events).await?;
    eprintln!(
        "bench: backlog written in {:.1} s, ends at {end_text}",
        backlog.write_secs
    );

    eprintln!("bench: draining {slot_a} with pg_recvlogical ...");
    let recvlogical =
        drain::recvlogical(svc, &slot_a, workload::PUBLICATION, &end_text, timeout).await?;
    workload::drop_slot(db, &slot_a).await?;
    eprintln!("bench: pg_recvlogical: {:.2} s", recvlogical.secs);

    eprintln!("bench: draining {slot_b} with siphon (kafka sink) ...");
    let kafka = drain::siphon(
        svc,
        db,
        &slot_b,
        workload::PUBLICATION,
        drain::Sink::Kafka,
        end_lsn,
        timeout,
    )
    .await?;
    workload::drop_slot(db, &slot_b).await?;
    eprintln!("bench: siphon->kafka: {:.2} s", kafka.secs);

    // A drain or a measurement that fails without stopping the run (exactly-once, Debezium) is
    // reported in its row; the run goes on and exits non-zero.
    let mut failure = None;
    let exactly_once = if args.no_exactly_once {
        Err("skipped: --no-exactly-once".to_owned())
    } else {
        eprintln!("bench: draining {slot_eos} with siphon (kafka sink, exactly-once) ...");
        let outcome = drain::siphon(
            svc,
            db,
            &slot_eos,
            workload::PUBLICATION,
            drain::Sink::KafkaExactlyOnce,
            end_lsn,
            timeout,
        )
        .await;
        workload::drop_slot(db, &slot_eos).await?;
        match outcome {
            Ok(d) => {
                eprintln!("bench: siphon->kafka (exactly-once): {:.2} s", d.secs);
                Ok(d)
            }
            Err(e) => {
                eprintln!("bench: siphon->kafka (exactly-once): FAILED: {e:#}");
                failure = Some(format!("the exactly-once drain failed: {e:#}"));
                Err(format!("FAILED: {e:#}"))
            }
        }
    };

    eprintln!("bench: draining {slot_c} with siphon (discard sink) ...");
    let discard = drain::siphon(
        svc,
        db,
        &slot_c,
        workload::PUBLICATION,
        drain::Sink::Discard,
        end_lsn,
        timeout,
    )
    .await?;
    workload::drop_slot(db, &slot_c).await?;
    eprintln!("bench: siphon->discard: {:.2} s", discard.secs);

    let avro = match &svc.registry {
        Err(why) => Err(why.clone()),
        Ok(_) => match avro::drains(svc, db, &avro_slots, end_lsn, timeout).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                eprintln!("bench: Avro rows: FAILED: {e:#}");
                failure.get_or_insert(format!("an Avro row failed: {e:#}"));
                Err(format!("FAILED: {e:#}"))
            }
        },
    };

    let debezium = match debezium {
        Err(why) => Err(why),
        Ok(oracle) => {
            eprintln!("bench: draining {slot_dbz} with debezium (embedded engine, discarding) ...");
            let outcome =
                debezium::drain(svc, db, &oracle, &slot_dbz, end_lsn, args.events, timeout).await;
            workload::drop_slot(db, &slot_dbz).await?;
            match outcome {
                Ok(d) => {
                    eprintln!("bench: debezium: {:.2} s", d.secs);
                    Ok(d)
                }
                Err(e) => {
                    eprintln!("bench: debezium: FAILED: {e:#}");
                    failure.get_or_insert(format!("the Debezium drain failed: {e:#}"));
                    Err(format!("FAILED: {e:#}"))
                }
            }
        }
    };

    let connect_rows = connect_drains(
        svc,
        db,
        &connect_install,
        workload::Shape::InsertOnly,
        &connect_slots,
        (end_lsn, args.events, timeout),
        &mut failure,
    )
    .await?;

    let all_operations = if args.no_all_operations {
        None
    } else {
        let shape = workload::Shape::AllOperations;
        eprintln!(
            "bench: draining {all_a} with pg_recvlogical ({}) ...",
            shape.slug()
        );
        let recvlogical =
            drain::recvlogical(svc, &all_a, shape.publication(), &end_text, timeout).await?;
        workload::drop_slot(db, &all_a).await?;
        eprintln!(
            "bench: pg_recvlogical ({}): {:.2} s",
            shape.slug(),
            recvlogical.secs
        );
        eprintln!(
            "bench: draining {all_b} with siphon (kafka sink, {}) ...",
            shape.slug()
        );
        let kafka = drain::siphon(
            svc,
            db,
            &all_b,
            shape.publication(),
            drain::Sink::Kafka,
            end_lsn,
            timeout,
        )
        .await?;
        workload::drop_slot(db, &all_b).await?;
        eprintln!(
            "bench: siphon->kafka ({}): {:.2} s",
            shape.slug(),
            kafka.secs
        );
        let connect = connect_drains(
            svc,
            db,
            &connect_install,
            shape,
            &all_connect_slots,
            (end_lsn, args.events, timeout),
            &mut failure,
        )
        .await?;
        Some(report::ShapeRows {
            recvlogical,
            kafka,
            connect,
        })
    };

    let contention = if args.contention {
        let hog = if args.hog_in_process {
            eprintln!(
                "bench: starting {} busy threads in the bench process",
                hog::THREADS
            );
            hog::Hog::in_process(hog::THREADS)?
        } else {
            eprintln!("bench: starting a program of {} busy threads", hog::THREADS);
            hog::Hog::program(hog::THREADS)?
        };
        // On an error below, `hog` is dropped with the future, which stops it.
        eprintln!("bench: draining {hog_a} with pg_recvlogical under the hog ...");
        let recvlogical =
            drain::recvlogical(svc, &hog_a, workload::PUBLICATION, &end_text, timeout).await?;
        workload::drop_slot(db, &hog_a).await?;
        eprintln!("bench: pg_recvlogical (hog): {:.2} s", recvlogical.secs);
        eprintln!("bench: draining {hog_b} with siphon (kafka sink) under the hog ...");
        let kafka = drain::siphon(
            svc,
            db,
            &hog_b,
            workload::PUBLICATION,
            drain::Sink::Kafka,
            end_lsn,
            timeout,
        )
        .await?;
        workload::drop_slot(db, &hog_b).await?;
        eprintln!("bench: siphon->kafka (hog): {:.2} s", kafka.secs);
        eprintln!("bench: draining {hog_c} with siphon (discard sink) under the hog ...");
        let discard = drain::siphon(
            svc,
            db,
            &hog_c,
            workload::PUBLICATION,
            drain::Sink::Discard,
            end_lsn,
            timeout,
        )
        .await?;
        workload::drop_slot(db, &hog_c).await?;
        eprintln!("bench: siphon->discard (hog): {:.2} s", discard.secs);
        let all_operations = if args.no_all_operations {
            None
        } else {
            let shape = workload::Shape::AllOperations;
            eprintln!(
                "bench: draining {hog_all_a} with pg_recvlogical ({}) under the hog ...",
                shape.slug()
            );
            let recvlogical =
                drain::recvlogical(svc, &hog_all_a, shape.publication(), &end_text, timeout)
                    .await?;
            workload::drop_slot(db, &hog_all_a).await?;
            eprintln!(
                "bench: draining {hog_all_b} with siphon (kafka sink, {}) under the hog ...",
                shape.slug()
            );
            let kafka = drain::siphon(
                svc,
                db,
                &hog_all_b,
                shape.publication(),
                drain::Sink::Kafka,
                end_lsn,
                timeout,
            )
            .await?;
            workload::drop_slot(db, &hog_all_b).await?;
            eprintln!(
                "bench: pg_recvlogical / siphon->kafka (hog, {}): {:.2} s / {:.2} s",
                shape.slug(),
                recvlogical.secs,
                kafka.secs
            );
            Some(report::ContendedShape { recvlogical, kafka })
        };
        hog.stop();
        eprintln!("bench: stopped the CPU hog");
        Some(report::Contention {
            threads: hog::THREADS,
            in_process: args.hog_in_process,
            recvlogical,
            kafka,
            discard,
            all_operations,
        })
    } else {
        None
    };

    let scaling = if args.slots_scaling {
        slots::prepare(db).await?;
        let events = args.scaling_events.unwrap_or(args.events);
        Some(slots::run(svc, db, events, args.txn_events, timeout).await?)
    } else {
        None
    };

    let latency = if args.latency_secs == 0 {
        None
    } else {
        eprintln!(
            "bench: latency: {} events/s for {} s ...",
            args.latency_rate, args.latency_secs
        );
        let plan = latency::Plan {
            secs: args.latency_secs,
            rate: args.latency_rate,
            txn_events: args.latency_txn_events,
            writers: args.latency_writers,
            sink: drain::Sink::Kafka,
        };
        Some(latency::run(svc, db, &slot_lat, &plan).await?)
    };
    let latency_exactly_once = if args.latency_secs == 0 {
        None
    } else if args.no_exactly_once {
        Some(Err("skipped: --no-exactly-once".to_owned()))
    } else {
        eprintln!(
            "bench: latency, exactly-once: {} events/s for {} s ...",
            args.eos_latency_rate, args.latency_secs
        );
        let plan = latency::Plan {
            secs: args.latency_secs,
            rate: args.eos_latency_rate,
            txn_events: args.latency_txn_events,
            writers: args.latency_writers,
            sink: drain::Sink::KafkaExactlyOnce,
        };
        Some(match latency::run(svc, db, &slot_lat_eos, &plan).await {
            Ok(l) => Ok(l),
            Err(e) => {
                eprintln!("bench: latency, exactly-once: FAILED: {e:#}");
                failure.get_or_insert(format!("the exactly-once latency phase failed: {e:#}"));
                Err(format!("FAILED: {e:#}"))
            }
        })
    };
    let calibration_ms_after = host::calibration_ms();
    eprintln!("bench: host calibration at the end: {calibration_ms_after:.0} ms");
    let broker = report::BrokerInfo {
        name: svc.broker_name.clone(),
        warm_up_records: svc.owns_broker().then_some(args.warm_up_records),
        warm_up_drains,
        peak_rss_bytes: svc
            .broker_pid
            .and_then(|pid| procstat::sample(pid).ok())
            .map(|u| u.peak_rss_bytes),
    };
    Ok(report::Results {
        broker,
        host: report::HostSpeed {
            cpu: host::cpu_model(),
            calibration_ms_before,
            calibration_ms_after,
        },
        backlog,
        recvlogical,
        kafka,
        exactly_once,
        discard,
        debezium,
        connect: connect_rows,
        avro,
        all_operations,
        scaling,
        contention,
        latency,
        latency_exactly_once,
        failure,
    })
}

/// The Debezium-on-Connect rows of one publication shape, one per producer setting, each on
/// its slot (dropped after its drain). A drain that fails is reported in its row and in
/// `failure`; the run goes on.
async fn connect_drains(
    svc: &services::Services,
    db: &tokio_postgres::Client,
    install: &std::result::Result<connect::Install, String>,
    shape: workload::Shape,
    slots: &[(connect::Producer, String)],
    (end_lsn, events, timeout): (u64, u64, Duration),
    failure: &mut Option<String>,
) -> Result<Vec<(&'static str, std::result::Result<drain::Drain, String>)>> {
    let mut rows = Vec::new();
    for (producer, slot) in slots {
        let name = producer.row_name();
        let row = match install {
            Err(why) => Err(why.clone()),
            Ok(install) => {
                eprintln!(
                    "bench: draining {slot} with Debezium on a Connect worker ({name}, {}) ...",
                    shape.slug()
                );
                let plan = connect::Plan {
                    producer: *producer,
                    publication: shape.publication(),
                    shape_slug: shape.slug(),
                    slot,
                    end_lsn,
                    events,
                    timeout,
                };
                let outcome = connect::drain(svc, db, install, &plan).await;
                workload::drop_slot(db, slot).await?;
                match outcome {
                    Ok(d) => {
                        eprintln!("bench: {name} ({}): {:.2} s", shape.slug(), d.secs);
                        Ok(d)
                    }
                    Err(e) => {
                        eprintln!("bench: {name} ({}): FAILED: {e:#}", shape.slug());
                        failure.get_or_insert(format!("{name} ({}) failed: {e:#}", shape.slug()));
                        Err(format!("FAILED: {e:#}"))
                    }
                }
            }
        };
        rows.push((name, row));
    }
    Ok(rows)
}

fn write_file(path: &PathBuf, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
