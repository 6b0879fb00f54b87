(* Formatting helpers: Printf into buffers and Format pretty-printing with boxes,
   including user printers passed to %a. *)

type item = { sku : int; label : string; qty : int; price : float; tags : string list }

let pp_tags ppf tags =
  Format.fprintf ppf "@[<hov 1>[%a]@]"
    (Format.pp_print_list ~pp_sep:(fun ppf () -> Format.fprintf ppf ";@ ") Format.pp_print_string)
    tags

let pp_item ppf it =
  Format.fprintf ppf "@[<hv 2>item %06d@ %-12s@ qty=%4d@ price=%10.3f@ tags=%a@]" it.sku it.label it.qty it.price
    pp_tags it.tags

let line buf it =
  Printf.bprintf buf "%08x|%-10s|%5d|%12.4f|%e|%s\n" it.sku it.label it.qty it.price (it.price /. 7.)
    (String.concat "," it.tags)

let money buf cents =
  let sign = if cents < 0 then "-" else "" in
  let c = abs cents in
  Printf.bprintf buf "%s%d.%02d" sign (c / 100) (c mod 100)
