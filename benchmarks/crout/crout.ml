(* Crout factorisation A = L U, L lower triangular, U unit upper triangular, stored
   together in one square array of rows; generic over the field. *)

exception Singular of int

module Make (F : Field.S) = struct
  type matrix = F.t array array

  let dot_range lo hi f =
    let s = ref F.zero in
    for k = lo to hi - 1 do s := F.add !s (f k) done;
    !s

  (* Returns the combined factor: lower part and diagonal are L, strict upper part is U. *)
  let factor (a : matrix) : matrix =
    let n = Array.length a in
    let lu = Array.map Array.copy a in
    for j = 0 to n - 1 do
      (* column j of L *)
      for i = j to n - 1 do
        lu.(i).(j) <- F.sub a.(i).(j) (dot_range 0 j (fun k -> F.mul lu.(i).(k) lu.(k).(j)))
      done;
      let d = lu.(j).(j) in
      if F.is_zero d then raise (Singular j);
      (* row j of U *)
      for i = j + 1 to n - 1 do
        lu.(j).(i) <- F.div (F.sub a.(j).(i) (dot_range 0 j (fun k -> F.mul lu.(j).(k) lu.(k).(i)))) d
      done
    done;
    lu

  let solve (lu : matrix) (b : F.t array) =
    let n = Array.length lu in
    let y = Array.make n F.zero in
    for i = 0 to n - 1 do
      y.(i) <- F.div (F.sub b.(i) (dot_range 0 i (fun k -> F.mul lu.(i).(k) y.(k)))) lu.(i).(i)
    done;
    for i = n - 1 downto 0 do
      y.(i) <- F.sub y.(i) (dot_range (i + 1) n (fun k -> F.mul lu.(i).(k) y.(k)))
    done;
    y

  let mul_vec (a : matrix) x = Array.map (fun row -> dot_range 0 (Array.length x) (fun k -> F.mul row.(k) x.(k))) a
end
