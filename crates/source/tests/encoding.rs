#![allow(clippy::unwrap_used)]
//! `siphon_source::encoding` against PostgreSQL's own conversions (`convert_from`): for every
//! server encoding Siphon maps, every byte of a single-byte encoding and every two-byte sequence
//! of EUC_KR converts to the text PostgreSQL gives, and what PostgreSQL refuses is an error.
//! Siphon may refuse what PostgreSQL converts only where the Encoding Standard has no character
//! (one sequence of EUC_KR): an error then, never another character.

use siphon_source::DatabaseEncoding;

const SINGLE_BYTE: &[&str] = &[
    "LATIN1",
    "LATIN2",
    "LATIN3",
    "LATIN4",
    "LATIN5",
    "LATIN6",
    "LATIN7",
    "LATIN8",
    "LATIN9",
    "LATIN10",
    "ISO_8859_5",
    "ISO_8859_6",
    "ISO_8859_7",
    "ISO_8859_8",
    "KOI8R",
    "KOI8U",
    "WIN866",
    "WIN874",
    "WIN1250",
    "WIN1251",
    "WIN1252",
    "WIN1253",
    "WIN1254",
    "WIN1255",
    "WIN1256",
    "WIN1257",
    "WIN1258",
];

/// The byte sequences of `encoding` to compare: every non-ASCII byte, or every two-byte
/// sequence with a non-ASCII lead.
fn sequences(encoding: &str) -> Vec<Vec<u8>> {
    if SINGLE_BYTE.contains(&encoding) {
        return (0x80..=0xFFu8).map(|b| vec![b]).collect();
    }
    (0x80..=0xFFu8)
        .flat_map(|lead| (0x20..=0xFFu8).map(move |trail| vec![lead, trail]))
        .collect()
}

#[tokio::test]
async fn conversions_are_postgresqls() {
    let pg = siphon_tests::Postgres::start().unwrap();
    let db = pg.connect().await.unwrap();
    db.batch_execute(
        "CREATE FUNCTION try_convert(b bytea, enc name) RETURNS text LANGUAGE plpgsql AS $$ \
         BEGIN RETURN convert_from(b, enc); EXCEPTION WHEN others THEN RETURN NULL; END $$",
    )
    .await
    .unwrap();
    let mut wrong = Vec::new();
    for &encoding in SINGLE_BYTE.iter().chain(&["EUC_KR"]) {
        let ours = DatabaseEncoding::from_server_encoding(encoding);
        assert!(ours.is_supported(), "{encoding}");
        let inputs = sequences(encoding);
        let rows = db
            .query(
                "SELECT try_convert(x, $2::text::name) \
                 FROM unnest($1::bytea[]) WITH ORDINALITY AS t(x, n) ORDER BY n",
                &[&inputs, &encoding],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), inputs.len());
        let mut refused = 0;
        for (input, row) in inputs.iter().zip(&rows) {
            let theirs: Option<String> = row.get(0);
            let mine = ours.decode(input).ok().map(|c| c.into_owned());
            match (&theirs, &mine) {
                (Some(_), None) => refused += 1,
                _ if theirs != mine => wrong.push(format!(
                    "{encoding} {input:02X?}: PostgreSQL {theirs:?}, Siphon {mine:?}"
                )),
                _ => {}
            }
        }
        let expected_refused = if encoding == "EUC_KR" { 1 } else { 0 };
        assert_eq!(
            refused, expected_refused,
            "{encoding}: sequences PostgreSQL converts and Siphon refuses"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // A mixed text converts as a whole as it does character by character.
    let text: Option<String> = db
        .query_one(
            "SELECT try_convert('\\x636166e920fc626572208541'::bytea, 'LATIN1')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let ours = DatabaseEncoding::from_server_encoding("LATIN1");
    assert_eq!(
        ours.decode(b"caf\xe9 \xfcber \x85A").ok().as_deref(),
        text.as_deref()
    );
    // Encodings whose Encoding Standard mapping differs from PostgreSQL's, or that have none:
    // only ASCII converts.
    for encoding in [
        "EUC_JP",
        "EUC_CN",
        "EUC_JIS_2004",
        "EUC_TW",
        "MULE_INTERNAL",
    ] {
        let ours = DatabaseEncoding::from_server_encoding(encoding);
        assert!(!ours.is_supported(), "{encoding}");
        assert_eq!(ours.decode(b"{\"a\":1}").unwrap(), "{\"a\":1}");
        assert!(ours.decode(b"\xa4\xa2").is_err(), "{encoding}");
    }
}
