//! `leash plugins`: add, list and show registered plugins.

use super::*;

pub(in crate::cli) async fn plugins(command: PluginsCommand) -> Result<ExitStatus, CliError> {
    match command {
        PluginsCommand::Add { conn, file, name, version } => {
            let bytes =
                std::fs::read(&file).map_err(|e| CliError::usage(format!("cannot read {}: {e}", file.display())))?;
            let name = match name {
                Some(name) => name,
                None => file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            };
            let mut path = format!("/v1/plugins?name={}", url_encode(&name));
            if let Some(version) = &version {
                path.push_str(&format!("&version={}", url_encode(version)));
            }
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let info = client.upload(&path, bytes).await?;
                if json_out {
                    print_json(&info)?;
                } else {
                    let info: PluginInfo = typed(info)?;
                    let name = info.name.map_or_else(|| "-".to_owned(), |n| terminal_text(&n.to_string()));
                    let _ = writeln!(std::io::stdout(), "{name} {} ({} bytes)", info.digest, info.size_bytes);
                }
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::List { conn } => {
            let json_out = conn.json;
            with_client(&conn, false, async move |client| {
                let list = client.json(Method::GET, "/v1/plugins", None).await?;
                if json_out {
                    return print_json(&list).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["NAME", "VERSION", "DIGEST", "SIZE", "CREATED"]);
                let list: PluginList = typed(list)?;
                for p in list.plugins {
                    let (name, version) = match p.name {
                        Some(n) => (terminal_text(&n.name), terminal_text(&n.version)),
                        None => ("-".to_owned(), "-".to_owned()),
                    };
                    table.add_row(vec![
                        name,
                        version,
                        short_digest(&p.digest.to_string()),
                        p.size_bytes.to_string(),
                        p.created_at.to_string(),
                    ]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
        PluginsCommand::Show { conn, reference } => {
            let json_out = conn.json;
            let path = format!("/v1/plugins/{}", url_encode(&reference));
            with_client(&conn, false, async move |client| {
                let info = client.json(Method::GET, &path, None).await?;
                if json_out {
                    return print_json(&info).map(|()| ExitStatus::Success);
                }
                let mut table = new_table(&["FIELD", "VALUE"]);
                for key in ["name", "version", "digest", "size_bytes", "created_at"] {
                    table.add_row(vec![key.to_owned(), text(&info[key])]);
                }
                print_table(table);
                Ok(ExitStatus::Success)
            })
            .await
        }
    }
}
