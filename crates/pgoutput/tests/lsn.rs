//! `Lsn` formatting and parsing.

use pgoutput::Lsn;
use proptest::prelude::*;

#[test]
fn displays_like_postgresql() {
    assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
    assert_eq!(Lsn(0).to_string(), "0/0");
    assert_eq!(Lsn::ZERO.to_string(), "0/0");
    assert_eq!(Lsn(0x1_0000_0000).to_string(), "1/0");
    assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
}

#[test]
fn parses_postgresql_notation() {
    assert_eq!("16/B374D848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
    assert_eq!("0/0".parse::<Lsn>(), Ok(Lsn(0)));
    assert_eq!("16/b374d848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
    assert_eq!("FFFFFFFF/FFFFFFFF".parse::<Lsn>(), Ok(Lsn(u64::MAX)));
}

#[test]
fn rejects_malformed_text() {
    for bad in [
        "",
        "/",
        "0",
        "0/",
        "/0",
        "16B374D848",
        "1/2/3",
        "G/0",
        "0/G",
        "100000000/0",
        "0/100000000",
        " 0/0",
        "-1/0",
    ] {
        assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
    }
}

#[test]
fn orders_by_position() {
    assert!("0/FFFFFFFF".parse::<Lsn>().unwrap() < "1/0".parse::<Lsn>().unwrap());
}

proptest! {
    #[test]
    fn display_and_parse_round_trip(v in any::<u64>()) {
        let text = Lsn(v).to_string();
        prop_assert_eq!(text.parse::<Lsn>(), Ok(Lsn(v)));
    }
}
