//! `--peers`: PyTorch eager, torch.compile, Liger and QuACK on the shapes rill just measured,
//! in the same invocation. `benches/peers/rows.py` (built into this binary) times them;
//! their records are charged rill's byte count for the same op, dtype and shape and the copy
//! measured in the same run, so every figure in a table compares like with like.

use crate::report::{COPY, RILL, Record};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

/// The script that times the peers; written next to the requests, so a bundle of this binary
/// alone can run it.
const SCRIPT: &str = include_str!("../peers/rows.py");

/// The script's exit status when python3 lacks torch or triton, or torch sees no GPU.
const NO_PEERS: i32 = 3;

/// One op, dtype and shape for the peers to time.
#[derive(Serialize, PartialEq)]
struct Request<'a> {
    op: &'a str,
    dtype: &'a str,
    shape: &'a [usize],
}

/// What the script measured for one request and implementation: a time or why not.
#[derive(Deserialize)]
struct PeerTime {
    implementation: String,
    op: String,
    dtype: String,
    shape: Vec<usize>,
    micros: Option<f64>,
    error: Option<String>,
}

/// The peers' records for rill's `records`, timed by `python` (an interpreter name or path)
/// with its files in `scratch`, and the lines worth printing about failures; `Err` with one
/// line where no peer could be measured at all (no python3, no torch, no GPU for torch).
pub fn measure(records: &[Record], python: &str, scratch: &Path) -> Result<(Vec<Record>, Vec<String>), String> {
    let mut requests: Vec<Request> = Vec::new();
    for r in records.iter().filter(|r| r.op != COPY && r.implementation == RILL) {
        let request = Request { op: &r.op, dtype: &r.dtype, shape: &r.shape };
        if !requests.contains(&request) {
            requests.push(request);
        }
    }
    let (script, asked, answered) =
        (scratch.join("rows.py"), scratch.join("requests.json"), scratch.join("peers.json"));
    let written = std::fs::create_dir_all(scratch)
        .and_then(|()| std::fs::write(&script, SCRIPT))
        .and_then(|()| std::fs::write(&asked, serde_json::to_string(&requests).unwrap_or_default()));
    written.map_err(|e| format!("cannot write the peers' script in {}: {e}", scratch.display()))?;

    let output = Command::new(python)
        .arg(&script)
        .arg("--requests")
        .arg(&asked)
        .arg("--json")
        .arg(&answered)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("peers not measured: cannot run {python} ({e})"))?;
    let said = String::from_utf8_lossy(&output.stdout).trim().to_string();
    match output.status.code() {
        Some(0) => {}
        Some(NO_PEERS) => return Err(said),
        _ => return Err(format!("peers not measured: {python} rows.py failed ({}) {said}", output.status)),
    }
    let json = std::fs::read_to_string(&answered).map_err(|e| format!("peers: {}: {e}", answered.display()))?;
    let times: Vec<PeerTime> =
        serde_json::from_str(&json).map_err(|e| format!("peers: {}: {e}", answered.display()))?;
    Ok(merge(records, times))
}

/// Each peer time as a record against rill's record of the same op, dtype and shape: the same
/// bytes (rill's GB/s times its time) and the same copy (rill's GB/s over its fraction).
fn merge(records: &[Record], times: Vec<PeerTime>) -> (Vec<Record>, Vec<String>) {
    let (mut merged, mut failures) = (Vec::new(), Vec::new());
    for time in times {
        let rill = records
            .iter()
            .find(|r| r.implementation == RILL && r.op == time.op && r.dtype == time.dtype && r.shape == time.shape);
        let (Some(rill), Some(micros)) = (rill, time.micros.filter(|m| m.is_finite() && *m > 0.0)) else {
            let why = time.error.as_deref().unwrap_or("no time");
            failures.push(format!("{} {} {} {:?}: {why}", time.implementation, time.op, time.dtype, time.shape));
            continue;
        };
        let gbps = rill.gbps * rill.micros / micros;
        merged.push(Record {
            micros,
            gbps,
            of_copy: rill.of_copy * rill.micros / micros,
            path: "-".into(),
            implementation: time.implementation,
            ..rill.clone()
        });
    }
    (merged, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rill(op: &str, micros: f64, gbps: f64) -> Record {
        Record {
            op: op.into(),
            dtype: "bf16".into(),
            shape: vec![49152, 1024],
            path: "warp path".into(),
            micros,
            gbps,
            of_copy: gbps / 3000.0,
            implementation: RILL.into(),
        }
    }

    fn time(implementation: &str, op: &str, micros: Option<f64>) -> PeerTime {
        PeerTime {
            implementation: implementation.into(),
            op: op.into(),
            dtype: "bf16".into(),
            shape: vec![49152, 1024],
            micros,
            error: micros.is_none().then(|| "rejected".into()),
        }
    }

    #[test]
    fn peers_are_charged_rills_bytes_and_copy() {
        let records = [rill("copy", 70.0, 3000.0), rill("softmax", 80.0, 2500.0)];
        let (merged, failures) = merge(
            &records,
            vec![
                time("Liger", "softmax", Some(40.0)),
                time("QuACK", "softmax", None),
                time("torch eager", "mystery", Some(1.0)),
            ],
        );
        assert_eq!(merged.len(), 1);
        let liger = &merged[0];
        assert_eq!((liger.implementation.as_str(), liger.op.as_str(), liger.path.as_str()), ("Liger", "softmax", "-"));
        assert_eq!((liger.micros, liger.gbps), (40.0, 5000.0));
        assert!((liger.of_copy - 5000.0 / 3000.0).abs() < 1e-12);
        assert_eq!(failures.len(), 2);
        assert!(failures[0].contains("QuACK softmax bf16") && failures[0].contains("rejected"), "{failures:?}");
        assert!(failures[1].contains("no time"), "{failures:?}");
    }

    #[test]
    fn without_an_interpreter_it_says_so_in_one_line() {
        let scratch = std::env::temp_dir().join(format!("rill-peers-test-{}", std::process::id()));
        let records = [rill("softmax", 80.0, 2500.0)];
        let why = measure(&records, "/nonexistent/python3", &scratch).err().unwrap();
        assert!(why.starts_with("peers not measured: cannot run /nonexistent/python3"), "{why}");
        assert_eq!(why.lines().count(), 1);
        let requests = std::fs::read_to_string(scratch.join("requests.json")).unwrap();
        assert_eq!(requests, r#"[{"op":"softmax","dtype":"bf16","shape":[49152,1024]}]"#);
        let _ = std::fs::remove_dir_all(&scratch);
    }

    /// Where python3 exists but torch does not (CI), the script exits 3 with one line.
    #[test]
    fn without_torch_the_script_says_so_in_one_line() {
        let has = |module: &str| {
            Command::new("python3").args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
        };
        if !has("json") || has("torch") {
            return println!("skipped: needs python3 without torch");
        }
        let scratch = std::env::temp_dir().join(format!("rill-peers-torchless-{}", std::process::id()));
        let why = measure(&[rill("softmax", 80.0, 2500.0)], "python3", &scratch).err().unwrap();
        assert_eq!(why, "peers not measured: python3 has no torch");
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
